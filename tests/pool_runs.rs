//! Fragments through the pool as runs of chunks (`proto::frag_for`): a
//! message from `frag_runs_from` bytes on crosses in fragments of several
//! chunks lying back to back, named by one ring message each. Two
//! processes, every byte checked, at sizes either side of where fragments
//! grow and of a full run (`Chunk::MAX_RUN` chunks); on a fresh pool, the
//! number of ring messages is the one `frag_for` gives; and a stream of
//! mixed sizes through a small pool, whose free list the runs must survive
//! being shuffled and short.

mod common;
use common::{pattern, run, World};
use shmfab::proto::{frag_for, Config};
use std::time::Duration;

/// Messages of `lens`, rank 0 to rank 1, all sent at once (sends wait
/// for ring room and pool chunks as they must), each received into its
/// own buffer: the first half posted before the sends, the rest after
/// (unexpected, or waiting for their receive: rendezvous). Every byte
/// checked, and nothing written past a buffer.
fn stream(w: &World, lens: &[usize]) {
    let base = 100u64;
    let half = lens.len() / 2;
    if w.rank == 1 {
        let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0xa5u8; l + 64]).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            if i == half {
                w.barrier(); // the sends may go
                w.barrier(); // they went
            }
            // SAFETY: the buffers live until their completions below.
            unsafe { w.ep.trecv(&mut b[..lens[i]], w.addrs[0], base + i as u64, 0, 5000 + i).unwrap() };
        }
        for (i, &len) in lens.iter().enumerate() {
            let (e, _) = w.wait_ctx(5000 + i).unwrap_or_else(|e| panic!("len {len}: {e:?}"));
            assert_eq!(e.len, len, "message {i}");
            let want = pattern(len, base + i as u64);
            if bufs[i][..len] != want[..] {
                let at = bufs[i].iter().zip(&want).position(|(a, b)| a != b).unwrap();
                panic!("message {i} of {len} B: first wrong byte at {at}");
            }
            assert!(bufs[i][len..].iter().all(|&b| b == 0xa5), "message {i} of {len} B: wrote past the buffer");
        }
    } else {
        let data: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| pattern(l, base + i as u64)).collect();
        w.barrier();
        for (i, d) in data.iter().enumerate() {
            // SAFETY: data lives until the sends' completions below.
            w.retry(|| unsafe { w.ep.tsend(d, w.addrs[1], base + i as u64, 6000 + i) });
        }
        w.barrier();
        for i in 0..lens.len() {
            w.ok(6000 + i);
        }
    }
    w.barrier();
    assert_eq!(w.unclaimed(), 0, "stray completions");
}

/// Sizes either side of every place the fragments change.
fn sizes(cfg: &Config) -> Vec<usize> {
    let chunk = cfg.geometry.chunk_size as usize;
    let run = chunk * shm_layout::wire::Chunk::MAX_RUN as usize;
    let mut v = vec![cfg.inline_max + 1, 2 * chunk + 1];
    let mut at = vec![cfg.frag_max * cfg.frag_parts, run, 200_000];
    if cfg.frag_runs_from != usize::MAX {
        at.extend([cfg.frag_runs_from, cfg.frag_runs_from + chunk * cfg.frag_parts]);
    }
    for t in at {
        v.extend([t - 1, t, t + 1]);
    }
    v
}

/// Every size of [`sizes`] through the pool, CMA off: up to rndv_min
/// (128 KiB) sent eagerly, larger ones asked for through it.
fn boundaries(name: &str, env: &[(&str, &str)]) {
    let mut all = vec![("SHMFAB_CMA", "off")];
    all.extend_from_slice(env);
    run(name, 2, &all, Duration::from_secs(120), |w| {
        let lens = sizes(w.dom.config());
        stream(&w, &lens);
        if w.rank == 0 {
            let s = w.ep.stats().unwrap();
            assert!(s.tx_bounce > 0 && s.tx_chunks > 0, "{s:?}");
        }
    });
}

#[test]
fn runs_carry_every_byte_at_every_boundary() {
    boundaries("runs_carry_every_byte_at_every_boundary", &[]);
}

#[test]
fn full_runs_carry_every_byte() {
    // One fragment per message up to MAX_RUN chunks.
    boundaries("full_runs_carry_every_byte", &[("SHMFAB_FRAG_MAX", "65536"), ("SHMFAB_FRAG_PARTS", "1")]);
}

#[test]
fn runs_of_larger_chunks_carry_every_byte() {
    boundaries(
        "runs_of_larger_chunks_carry_every_byte",
        &[("SHMFAB_CHUNK_SIZE", "8192"), ("SHMFAB_FRAG_SIZE", "8192")],
    );
}

#[test]
fn a_fresh_pool_sends_one_ring_message_per_fragment() {
    run(
        "a_fresh_pool_sends_one_ring_message_per_fragment",
        2,
        &[("SHMFAB_CMA", "off")],
        Duration::from_secs(60),
        |w| {
            let cfg = w.dom.config().clone();
            // The shortest message through the pool first.
            for len in [cfg.inline_max + 1, 32 << 10, 64 << 10, 100_000] {
                let before = w.ep.stats().unwrap().tx_chunks;
                stream(&w, &[len]);
                if w.rank == 0 {
                    let sent = w.ep.stats().unwrap().tx_chunks - before;
                    let frag = frag_for(&cfg, len);
                    assert_eq!(sent as usize, len.div_ceil(frag), "{len} B in fragments of {frag}");
                }
            }
            // Past 16 KiB the fragments are runs of chunks.
            assert!(frag_for(&cfg, 64 << 10) > cfg.geometry.chunk_size as usize);
        },
    );
}

#[test]
fn runs_survive_a_small_shuffled_pool() {
    // 24 chunks: several messages in flight at once, sends waiting for
    // chunks, the free list returned in pieces and out of order; mixed
    // sizes, so runs are cut short by what the stash holds.
    let env = [("SHMFAB_CMA", "off"), ("SHMFAB_POOL_CHUNKS", "24")];
    run("runs_survive_a_small_shuffled_pool", 2, &env, Duration::from_secs(120), |w| {
        let mut lens = vec![];
        for i in 0..60usize {
            lens.push([70_000, 5_000, 33_000, 16_385, 90_001, 4_097, 65_536, 12_288][i % 8] + i);
        }
        stream(&w, &lens);
    });
}

#[test]
fn receives_in_the_copys_slow_band_carry_every_byte() {
    // Pool chunks start on page boundaries, so a receive buffer k bytes
    // past a page puts every fragment's copy k bytes ahead of its source
    // modulo 4096: 1-31 is the band where `memcpy` collapses and
    // `shmfab::copy` uses its own loop (back to front), 32-63 and 0 are
    // `memcpy`'s. Eager (16-64 KiB) and asked for through the pool
    // (200 KB, CMA off), each buffer with guard bytes either side.
    run(
        "receives_in_the_copys_slow_band_carry_every_byte",
        2,
        &[("SHMFAB_CMA", "off")],
        Duration::from_secs(120),
        |w| {
            let offsets = [0usize, 1, 16, 31, 32, 63];
            let lens = [16 << 10, (64 << 10) + 7, 200_000];
            let slot = 200_000usize.next_multiple_of(4096) + 8192;
            let tag = |i: usize| 300 + i as u64;
            let n = offsets.len() * lens.len();
            if w.rank == 1 {
                let mut arena = vec![0x5au8; n * slot + 2 * 4096];
                let page = arena.as_ptr().align_offset(4096);
                let at = |i: usize| page + 4096 + i * slot + offsets[i % offsets.len()];
                for i in 0..n {
                    let len = lens[i / offsets.len()];
                    let a = at(i);
                    assert_eq!((arena.as_ptr() as usize + a) % 4096, offsets[i % offsets.len()]);
                    // SAFETY: the arena lives until every completion below; the
                    // ranges are disjoint (slot apart).
                    let b = unsafe { std::slice::from_raw_parts_mut(arena.as_mut_ptr().add(a), len) };
                    // SAFETY: as above.
                    unsafe { w.ep.trecv(b, w.addrs[0], tag(i), 0, 7000 + i).unwrap() };
                }
                w.barrier();
                for i in 0..n {
                    let (len, off) = (lens[i / offsets.len()], offsets[i % offsets.len()]);
                    let (e, _) = w.wait_ctx(7000 + i).unwrap_or_else(|e| panic!("{len} B at +{off}: {e:?}"));
                    assert_eq!(e.len, len);
                    let a = at(i);
                    let want = pattern(len, tag(i));
                    if arena[a..a + len] != want[..] {
                        let first = arena[a..a + len].iter().zip(&want).position(|(x, y)| x != y).unwrap();
                        panic!("{len} B at +{off}: first wrong byte at {first}");
                    }
                    assert!(arena[a - 64..a].iter().all(|&b| b == 0x5a), "{len} B at +{off}: wrote before");
                    assert!(arena[a + len..a + len + 64].iter().all(|&b| b == 0x5a), "{len} B at +{off}: wrote after");
                }
            } else {
                let data: Vec<Vec<u8>> = (0..n).map(|i| pattern(lens[i / offsets.len()], tag(i))).collect();
                w.barrier();
                for (i, d) in data.iter().enumerate() {
                    // SAFETY: data lives until the sends' completions below.
                    w.retry(|| unsafe { w.ep.tsend(d, w.addrs[1], tag(i), 8000 + i) });
                }
                for i in 0..n {
                    w.ok(8000 + i);
                }
            }
            w.barrier();
            assert_eq!(w.unclaimed(), 0, "stray completions");
        },
    );
}

#[test]
fn sends_from_every_line_offset_carry_every_byte() {
    // The pool path from send buffers at every kind of offset in a cache
    // line, one segment or three (segments ending mid-line and mid-chunk,
    // so fragments gather across them), eager (5 KB-100 KB) and asked for
    // through the pool (200 KB, CMA off), into receive buffers at several
    // offsets; every byte checked, guard bytes either side.
    run("sends_from_every_line_offset_carry_every_byte", 2, &[("SHMFAB_CMA", "off")], Duration::from_secs(120), |w| {
        let offsets = [0usize, 1, 16, 31, 32, 48, 63];
        let lens = [5_000usize, 16 << 10, (64 << 10) + 7, 100_000, 200_000];
        let cases: Vec<(usize, usize, bool)> =
            lens.iter().flat_map(|&l| offsets.iter().flat_map(move |&o| [(l, o, false), (l, o, true)])).collect();
        let tag = |i: usize| 900 + i as u64;
        if w.rank == 1 {
            let mut bufs: Vec<Vec<u8>> = cases.iter().map(|&(l, _, _)| vec![0x3cu8; l + 256]).collect();
            let at = |b: &Vec<u8>, i: usize| b.as_ptr().align_offset(64) + 64 + [0usize, 16, 40][i % 3];
            for (i, b) in bufs.iter_mut().enumerate() {
                let (a, l) = (at(b, i), cases[i].0);
                // SAFETY: the buffers live until their completions below.
                unsafe { w.ep.trecv(&mut b[a..a + l], w.addrs[0], tag(i), 0, 9000 + i).unwrap() };
            }
            w.barrier();
            for (i, &(l, o, v)) in cases.iter().enumerate() {
                let (e, _) = w.wait_ctx(9000 + i).unwrap_or_else(|e| panic!("{l} B from +{o} (iov {v}): {e:?}"));
                assert_eq!(e.len, l);
                let (b, a) = (&bufs[i], at(&bufs[i], i));
                let want = pattern(l, tag(i));
                if b[a..a + l] != want[..] {
                    let first = b[a..a + l].iter().zip(&want).position(|(x, y)| x != y).unwrap();
                    panic!("{l} B from +{o} (iov {v}): first wrong byte at {first}");
                }
                assert!(b[..a].iter().all(|&x| x == 0x3c), "{l} B from +{o}: wrote before");
                assert!(b[a + l..].iter().all(|&x| x == 0x3c), "{l} B from +{o}: wrote after");
            }
        } else {
            // One message per case, `o` bytes past a line; the three-segment
            // form cuts it at a third and two thirds plus 5, each segment in
            // a buffer of its own at a different line offset.
            let mut keep: Vec<Vec<u8>> = Vec::new();
            let mut msgs: Vec<Vec<(usize, usize)>> = Vec::new();
            for (i, &(l, o, v)) in cases.iter().enumerate() {
                let data = pattern(l, tag(i));
                let cuts = if v { vec![0, l / 3, 2 * l / 3 + 5, l] } else { vec![0, l] };
                let mut segs = Vec::new();
                for (k, c) in cuts.windows(2).enumerate() {
                    let n = c[1] - c[0];
                    let mut b = vec![0u8; n + 128];
                    let a = b.as_ptr().align_offset(64) + (o + 24 * k) % 64;
                    b[a..a + n].copy_from_slice(&data[c[0]..c[1]]);
                    segs.push((keep.len(), a));
                    keep.push(b);
                }
                msgs.push(segs);
            }
            w.barrier();
            for (i, segs) in msgs.iter().enumerate() {
                let (l, _, v) = cases[i];
                let cuts = if v { vec![0, l / 3, 2 * l / 3 + 5, l] } else { vec![0, l] };
                let iov: Vec<std::io::IoSlice<'_>> = segs
                    .iter()
                    .zip(cuts.windows(2))
                    .map(|(&(b, a), c)| std::io::IoSlice::new(&keep[b][a..a + c[1] - c[0]]))
                    .collect();
                // SAFETY: keep lives until the sends' completions below.
                w.retry(|| unsafe { w.ep.tsendv(&iov, w.addrs[1], tag(i), 10_000 + i) });
            }
            for i in 0..cases.len() {
                w.ok(10_000 + i);
            }
            assert!(w.ep.stats().unwrap().tx_chunks > 0);
        }
        w.barrier();
        assert_eq!(w.unclaimed(), 0, "stray completions");
    });
}
