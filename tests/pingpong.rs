//! Two processes ping-pong every size from 0 B to 8 MiB (powers of two and
//! one byte either side of every protocol threshold), every byte checked,
//! with the receive posted before the send (expected) and after it
//! (unexpected); again with CMA off and with CMA refused by the "kernel".

mod common;
use common::{pattern, run, World};
use std::time::Duration;

fn sizes(w: &World) -> Vec<usize> {
    let cfg = w.dom.config();
    let mut v = vec![0usize];
    let mut p = 1;
    while p <= 8 << 20 {
        v.push(p);
        p *= 2;
    }
    let chunk = cfg.geometry.chunk_size as usize;
    let frag = cfg.frag_size;
    for t in [32usize, 96, cfg.inline_max, chunk, cfg.cma_min, cfg.rndv_min, cfg.split_min, 3 * chunk, frag, 3 * frag] {
        v.extend([t - 1, t, t + 1]);
    }
    v.sort();
    v.dedup();
    v
}

/// Where a buffer of `len` bytes starts in a vector of `len + extra +
/// 4096`: at malloc's placement for messages below single copy's
/// threshold, at a page boundary from it. Two processes' heaps differ by a
/// few allocations, so malloc's placements of their buffers can sit a
/// constant 16-48 bytes apart modulo 4096: in the kernel copy's slow band,
/// where every rendezvous goes through the pool (rightly: see
/// `aliased_single_copy_goes_through_the_pool`), and none would test
/// single copy. Page-aligned on both sides, they never are.
fn start(v: &[u8], len: usize, cfg: &shmfab::proto::Config) -> usize {
    if len >= cfg.cma_min.min(cfg.rndv_min) {
        v.as_ptr().align_offset(4096)
    } else {
        0
    }
}

/// One message `from` -> `to` of `len` bytes; `expected` posts the receive
/// before the send goes out.
fn one_way(w: &World, from: usize, to: usize, len: usize, tag: u64, expected: bool) {
    let ctx_send = 1000 + tag as usize;
    let ctx_recv = 2000 + tag as usize;
    let cfg = w.dom.config();
    if w.rank == to {
        let mut whole = vec![0xa5u8; len + 16 + 4096];
        let at = start(&whole, len, cfg);
        let buf = &mut whole[at..at + len + 16];
        let post = |buf: &mut [u8]| {
            // SAFETY: buf lives until the receive's completion below.
            unsafe { w.ep.trecv(&mut buf[..len], w.addrs[from], tag, 0, ctx_recv).unwrap() };
        };
        if expected {
            post(buf);
            w.barrier();
        } else {
            w.barrier();
            post(buf);
        }
        let (e, src) = w.wait_ctx(ctx_recv).unwrap_or_else(|e| panic!("len {len}: error {e:?}"));
        assert_eq!(e.len, len, "length of a {len}-byte message");
        assert_eq!(e.tag, tag);
        assert_eq!(src, w.addrs[from], "source fi_addr");
        assert_eq!(e.flags & shmfab::FI_RECV, shmfab::FI_RECV);
        let want = pattern(len, tag);
        if buf[..len] != want[..] {
            let at = buf.iter().zip(&want).position(|(a, b)| a != b).unwrap();
            panic!("len {len} ({}): first wrong byte at {at}", if expected { "expected" } else { "unexpected" });
        }
        assert!(buf[len..].iter().all(|&b| b == 0xa5), "len {len}: wrote past the buffer");
    } else if w.rank == from {
        let mut whole = vec![0u8; len + 4096];
        let at = start(&whole, len, cfg);
        let data = &mut whole[at..at + len];
        data.copy_from_slice(&pattern(len, tag));
        let data = &*data;
        if expected {
            w.barrier();
            // SAFETY: data lives until the send's completion below.
            w.retry(|| unsafe { w.ep.tsend(data, w.addrs[to], tag, ctx_send) });
        } else {
            // SAFETY: as above.
            w.retry(|| unsafe { w.ep.tsend(data, w.addrs[to], tag, ctx_send) });
            w.barrier();
        }
        let e = w.ok(ctx_send);
        assert_eq!(e.flags & shmfab::FI_SEND, shmfab::FI_SEND);
    }
}

fn pingpong_body(w: &World) {
    let mut tag = 1u64;
    for len in sizes(w) {
        for expected in [true, false] {
            one_way(w, 0, 1, len, tag, expected);
            one_way(w, 1, 0, len, tag + 1, expected);
            tag += 2;
        }
    }
    w.barrier();
    assert_eq!(w.unclaimed(), 0, "stray completions");
    let s = w.ep.stats().unwrap();
    assert!(s.tx_inline > 0 && s.tx_rndv > 0, "{s:?}");
}

#[test]
fn pingpong_every_size() {
    run("pingpong_every_size", 2, &[], Duration::from_secs(240), |w| {
        pingpong_body(&w);
        let s = w.ep.stats().unwrap();
        if shmfab::internal::cma::available() {
            // Buffers that happen to sit in the kernel copy's slow band go
            // through the pool (aliased_single_copy_goes_through_the_pool).
            assert!(s.cma_reads > 0 && s.cma_fallbacks == s.cma_aliased && s.split_copies > 0, "{s:?}");
        }
        // Mid sizes go through the pool's fragments, single copy or not
        // (with single copy, in the rendezvous whose receiver measures the
        // pool, and in the eager runs after it picks the pool: chunks).
        assert!(s.tx_chunks > 0, "{s:?}");
    });
}

/// A rendezvous message between buffers at chosen page offsets: the
/// sender's at `so`, the receiver's at `ro` (bytes past a page boundary).
fn placed_one_way(w: &World, len: usize, so: usize, ro: usize, tag: u64) {
    let mut v = vec![0xa5u8; len + 3 * 4096];
    let at = v.as_ptr().align_offset(4096);
    if w.rank == 1 {
        let buf = &mut v[at + ro..at + ro + len];
        // SAFETY: v lives until the receive's completion below.
        unsafe { w.ep.trecv(buf, w.addrs[0], tag, 0, 7).unwrap() };
        w.barrier();
        let (e, _) = w.wait_ctx(7).unwrap_or_else(|e| panic!("len {len} at +{ro}: {e:?}"));
        assert_eq!(e.len, len);
        assert!(v[at + ro..at + ro + len] == pattern(len, tag)[..], "len {len} from +{so} to +{ro}: wrong bytes");
        assert!(v[..at + ro].iter().chain(&v[at + ro + len..]).all(|&b| b == 0xa5), "wrote outside the buffer");
    } else {
        v[at + so..at + so + len].copy_from_slice(&pattern(len, tag));
        w.barrier();
        // SAFETY: v lives until the send's completion below.
        w.retry(|| unsafe { w.ep.tsend(&v[at + so..at + so + len], w.addrs[1], tag, 8) });
        w.ok(8);
    }
}

#[test]
fn aliased_single_copy_goes_through_the_pool() {
    // The receiver's buffer 16 bytes further into its page than the
    // sender's: the kernel's copy would run 4-5x slower (crate::copy), so
    // the receiver asks for the data through the pool. 64 bytes further:
    // single copy as usual. Split copies are off to keep the counts plain.
    run("aliased_single_copy_goes_through_the_pool", 2, &[("SHMFAB_SPLIT_MIN", "1g")], Duration::from_secs(60), |w| {
        let cma = shmfab::internal::cma::available();
        let mut tag = 1;
        for len in [256 << 10, (1 << 20) + 100] {
            for (so, ro, aliased) in [(0, 16, true), (0, 64, false), (40, 56, true), (4000, 4031, true), (16, 0, false)]
            {
                let before = w.ep.stats().unwrap();
                placed_one_way(&w, len, so, ro, tag);
                tag += 1;
                w.barrier();
                let s = w.ep.stats().unwrap();
                if w.rank == 1 && cma {
                    let (al, rd) = (s.cma_aliased - before.cma_aliased, s.cma_reads - before.cma_reads);
                    let want = cfg!(target_arch = "x86_64") && aliased;
                    assert_eq!((al, rd), if want { (1, 0) } else { (0, 1) }, "len {len} +{so} -> +{ro}: {s:?}");
                }
            }
        }
    });
}

#[test]
fn rendezvous_band_takes_both_paths_by_measure() {
    // 64 KiB and 192 KiB messages both ways (two classes of
    // proto::pick_class), page-aligned so none is in the copy band: each
    // receiver measures single copy first, then the pool, then keeps the
    // faster and tries the other every 64th time. Whatever the timings,
    // both paths carry messages, and every byte arrives.
    run("rendezvous_band_takes_both_paths_by_measure", 2, &[], Duration::from_secs(60), |w| {
        let mut tag = 100;
        for len in [64 << 10, 192 << 10] {
            for _ in 0..20 {
                placed_one_way(&w, len, 0, 0, tag);
                w.barrier();
                placed_one_way_back(&w, len, tag + 1);
                w.barrier();
                tag += 2;
            }
        }
        let s = w.ep.stats().unwrap();
        if shmfab::internal::cma::available() {
            assert!(s.cma_reads >= 2 && s.pool_picked >= 2, "both paths measured in both classes: {s:?}");
            assert_eq!(s.cma_aliased, 0, "{s:?}");
        }
        assert_eq!(w.unclaimed(), 0, "stray completions");
    });
}

/// [`placed_one_way`] from rank 1 to rank 0, both buffers page-aligned.
fn placed_one_way_back(w: &World, len: usize, tag: u64) {
    let mut v = vec![0xa5u8; len + 3 * 4096];
    let at = v.as_ptr().align_offset(4096);
    if w.rank == 0 {
        let buf = &mut v[at..at + len];
        // SAFETY: v lives until the receive's completion below.
        unsafe { w.ep.trecv(buf, w.addrs[1], tag, 0, 9).unwrap() };
        w.barrier();
        let (e, _) = w.wait_ctx(9).unwrap_or_else(|e| panic!("len {len} back: {e:?}"));
        assert_eq!(e.len, len);
        assert!(v[at..at + len] == pattern(len, tag)[..], "len {len} back: wrong bytes");
    } else {
        v[at..at + len].copy_from_slice(&pattern(len, tag));
        w.barrier();
        // SAFETY: v lives until the send's completion below.
        w.retry(|| unsafe { w.ep.tsend(&v[at..at + len], w.addrs[0], tag, 10) });
        w.ok(10);
    }
}

#[test]
fn pingpong_every_size_split_write_refused() {
    // Senders cannot write into receivers: every split copy's second half
    // must be read by the receiver itself after the sender says so.
    run("pingpong_every_size_split_write_refused", 2, &[("SHMFAB_CMA", "nowrite")], Duration::from_secs(240), |w| {
        pingpong_body(&w);
        let s = w.ep.stats().unwrap();
        if shmfab::internal::cma::available() {
            assert!(s.split_copies > 0, "{s:?}");
        }
    });
}

#[test]
fn pingpong_every_size_cma_off() {
    run("pingpong_every_size_cma_off", 2, &[("SHMFAB_CMA", "off")], Duration::from_secs(240), |w| {
        pingpong_body(&w);
        let s = w.ep.stats().unwrap();
        assert!(s.cma_reads == 0 && s.cma_fallbacks > 0, "{s:?}");
        assert!(s.tx_bounce > 0 && s.tx_chunks > 0, "the pool carries the data: {s:?}");
    });
}

#[test]
fn pingpong_every_size_cma_refused() {
    // The receiver acts as if process_vm_readv failed with EPERM: every
    // rendezvous must fall back to the pool path.
    run("pingpong_every_size_cma_refused", 2, &[("SHMFAB_CMA", "fail")], Duration::from_secs(240), |w| {
        pingpong_body(&w);
        let s = w.ep.stats().unwrap();
        assert!(s.cma_reads == 0 && s.cma_fallbacks > 0, "{s:?}");
        assert!(s.tx_bounce > 0 && s.tx_chunks > 0, "the pool carries the data: {s:?}");
    });
}

#[test]
fn pingpong_every_size_overflow_queue() {
    // One ring slot per endpoint, claimed first by a third rank: ranks 0
    // and 1 then talk to each other through the MPSC overflow queue.
    run("pingpong_every_size_overflow_queue", 3, &[("SHMFAB_RING_SLOTS", "1")], Duration::from_secs(240), |w| {
        // Rank 2 grabs the only slot of ranks 0 and 1 first.
        if w.rank == 2 {
            w.retry(|| w.ep.inject(b"x", w.addrs[0]));
            w.retry(|| w.ep.inject(b"x", w.addrs[1]));
        }
        let mut b = [0u8; 1];
        if w.rank < 2 {
            // SAFETY: b outlives the completion wait.
            unsafe { w.ep.recv(&mut b, w.addrs[2], 77).unwrap() };
            w.ok(77);
        }
        w.barrier(); // rank 0's and 1's barrier traffic now goes through overflow
                     // Every protocol through the overflow queue: inline, the pool's
                     // fragments (73 B up to the single-copy threshold, across fragment
                     // boundaries), rendezvous.
        const LENS: [usize; 15] = [0, 1, 31, 32, 33, 72, 73, 4096, 16383, 16385, 40000, 65535, 70000, 200000, 1 << 20];
        if w.rank < 2 {
            let mut tag = 1u64;
            for len in LENS {
                for expected in [true, false] {
                    one_way_pair(&w, len, tag, expected);
                    tag += 2;
                }
            }
            let s = w.ep.stats().unwrap();
            assert!(s.rx_ovf > 40, "ranks 0 and 1 must talk through the overflow queue: {s:?}");
        } else {
            // Two directions, expected and unexpected: one barrier each.
            for _ in 0..LENS.len() * 4 {
                w.barrier();
            }
        }
        w.barrier();
    });
}

/// `one_way` both directions between ranks 0 and 1, with a third rank
/// taking part in the barriers.
fn one_way_pair(w: &World, len: usize, tag: u64, expected: bool) {
    one_way(w, 0, 1, len, tag, expected);
    one_way(w, 1, 0, len, tag + 1, expected);
}
