//! The FIN that ends a rendezvous (issue 14): a rendezvous whose data the
//! receiver took through the pool sends its sender a FIN only when the
//! sender asked (FI_DELIVERY_COMPLETE: `rts_flags::FIN`, carried through
//! the unexpected queue when the receive comes later); such a send still
//! completes only once the data is in the receive buffer. A single copy
//! always ends with a FIN (the receiver reads the sender's buffer). And a
//! sender whose rendezvous the receiver took through the pool sends the
//! next few of that size class eagerly through the pool. One
//! process, two endpoints of one domain, configured without the
//! environment (`Fabric::with_config`).

use shmfab::*;
use std::io::IoSlice;
use std::time::{Duration, Instant};

/// `n` entries of `cq`, within 10 s.
fn take(dom: &Domain, cq: &CompletionQueue, n: usize, what: &str) -> Vec<CqTaggedEntry> {
    let t0 = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}: {} of {n}", got.len());
        let _ = dom.progress();
        let mut e = vec![CqTaggedEntry::default(); n - got.len()];
        match cq.read(&mut e) {
            Ok(k) => got.extend_from_slice(&e[..k]),
            Err(x) if x.kind() == ErrorKind::Again => std::thread::yield_now(),
            Err(x) => panic!("{what}: {x} {:?}", cq.readerr()),
        }
    }
    got
}

struct Pair {
    dom: Domain,
    cqs: Vec<CompletionQueue>,
    eps: Vec<Endpoint>,
    /// ep0's address in the AV (ep1 sends to it).
    to0: FiAddr,
}

fn pair(cfg: proto::Config, job: &str) -> Pair {
    std::env::set_var("SHMFAB_JOB_ID", format!("{job}-{}", std::process::id()));
    let dom = Fabric::with_config(cfg).unwrap().domain_with(Threading::Domain).unwrap();
    let cqs: Vec<_> = (0..2).map(|_| dom.cq_open(&CqAttr::default()).unwrap()).collect();
    let av = dom.av_open().unwrap();
    let eps: Vec<_> = (0..2).map(|_| dom.endpoint().unwrap()).collect();
    for (ep, cq) in eps.iter().zip(&cqs) {
        ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
    }
    let to0 = av.insert(&[eps[0].getname()]).unwrap()[0];
    Pair { dom, cqs, eps, to0 }
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|j| (j * 13 + seed) as u8).collect()
}

/// `len` bytes of `store` (grown to fit) starting on a page boundary:
/// the send and receive buffers at the same offset in their pages, out of
/// the kernel copy's slow band (`shmfab::copy`), so a single copy is
/// taken when offered.
fn page_aligned(store: &mut Vec<u8>, len: usize) -> &mut [u8] {
    store.resize(len + 4096, 0);
    let off = store.as_ptr().align_offset(4096);
    &mut store[off..off + len]
}

/// Sends `len` bytes from ep1 to ep0 (with FI_DELIVERY_COMPLETE when
/// `dc`), the receive posted before the send or, with `late_recv`, after
/// the RTS sits in ep0's unexpected queue. Returns the FINs ep0 sent for it.
fn one(t: &Pair, len: usize, dc: bool, late_recv: bool, seed: usize) -> u64 {
    let (mut ms, mut rs) = (Vec::new(), Vec::new());
    let msg = page_aligned(&mut ms, len);
    msg.copy_from_slice(&pattern(len, seed));
    let msg = &*msg;
    let rb = page_aligned(&mut rs, len);
    let fins0 = t.eps[0].stats().unwrap().fins;
    let post = |rb: &mut [u8]| {
        // SAFETY: rb outlives the receive's completion, taken below.
        unsafe { t.eps[0].recv(rb, FI_ADDR_UNSPEC, 1).unwrap() };
    };
    if !late_recv {
        post(rb);
    }
    let iov = [IoSlice::new(msg)];
    let sm = SendMsg { iov: &iov, dest: t.to0, context: 2, data: 0, tag: 0 };
    let flags = if dc { FI_DELIVERY_COMPLETE | FI_COMPLETION } else { FI_COMPLETION };
    // SAFETY: msg outlives the send's completion, taken below.
    unsafe { t.eps[1].sendmsg(&sm, flags).unwrap() };
    if late_recv {
        // Let the RTS arrive and queue as unexpected.
        for _ in 0..50 {
            let _ = t.dom.progress();
        }
        assert!(t.eps[1].stats().unwrap().tx_rndv > 0, "a rendezvous");
        post(rb);
    }
    take(&t.dom, &t.cqs[1], 1, "send");
    if dc {
        // Delivery complete: the data is in place when the send completes,
        // before the receive's completion is even read.
        // SAFETY: nothing writes rb any more (its receive is done, since
        // the sender had the FIN); read through a pointer as the
        // provider wrote it behind the borrow.
        let now = unsafe { std::slice::from_raw_parts(rb.as_ptr(), len) };
        assert!(now == msg, "delivery complete before the data was in place (len {len})");
    }
    take(&t.dom, &t.cqs[0], 1, "recv");
    assert!(*rb == *msg, "len {len}");
    // Anything still queued (a FIN that should not be) leaves now.
    for _ in 0..20 {
        let _ = t.dom.progress();
    }
    t.eps[0].stats().unwrap().fins - fins0
}

#[test]
fn a_pool_rendezvous_sends_a_fin_only_when_asked() {
    // No single copy: rendezvous from rndv_min, its data through the pool.
    let cfg = proto::Config { cma: proto::CmaMode::Off, ..proto::Config::default() };
    let len = cfg.rndv_min * 2;
    let t = pair(cfg, "zzfin");
    for (i, late) in [false, true, false, true].into_iter().enumerate() {
        let before = t.eps[0].stats().unwrap();
        assert_eq!(one(&t, len, false, late, i), 0, "plain send, late receive {late}: no FIN");
        assert_eq!(one(&t, len, true, late, i + 7), 1, "delivery complete, late receive {late}: one FIN");
        let after = t.eps[0].stats().unwrap();
        assert_eq!(after.cma_fallbacks - before.cma_fallbacks, 2, "both through the pool");
        assert_eq!(after.cma_reads, 0);
    }
    // A delivery-complete send of no bytes goes by rendezvous too: its
    // FIN completes it.
    assert_eq!(one(&t, 0, true, false, 3), 1, "no bytes, delivery complete");
    assert_eq!(one(&t, 0, false, false, 3), 0, "no bytes, inline: no FIN");
    assert_eq!(t.eps[1].stats().unwrap().tx_rndv, 9);
}

#[test]
fn a_single_copy_rendezvous_always_ends_with_a_fin() {
    // At split_min: above the band where the pool may be picked; the
    // first a single copy, the others split copies (their FIN follows the
    // sender's WDONE).
    let cfg = proto::Config::default();
    let len = cfg.split_min;
    assert!(proto::pick_class(&cfg, len).is_none());
    let t = pair(cfg, "zzfinc");
    for (i, (dc, late)) in [(false, false), (true, false), (false, true), (true, true)].into_iter().enumerate() {
        let reads = t.eps[0].stats().unwrap().cma_reads;
        let fins = one(&t, len, dc, late, i);
        let s = t.eps[0].stats().unwrap();
        if s.cma_reads > reads {
            assert_eq!(fins, 1, "dc {dc}, late receive {late}: the sender's buffer was read");
        } else {
            // CMA refused here (no ptrace rights) or the buffers in the
            // kernel copy's slow band: the pool carried it, and the FIN
            // followed the flag.
            assert!(s.cma_fallbacks > 0);
            assert_eq!(fins, u64::from(dc), "dc {dc}, late receive {late}");
        }
    }
}

#[test]
fn after_the_receiver_takes_the_pool_the_next_sends_go_eagerly() {
    // The receiver takes a rendezvous through the pool when its buffer
    // sits 1-63 bytes past the sender's modulo 4096 (the kernel copy's
    // slow band: shmfab::copy), answering CTS_BOUNCE_THIS_ONE: the sender
    // then sends the next EAGER_RUN (7) of that class eagerly, then one by
    // rendezvous again. Eagerly is the way without single copy: inline in
    // the lowest class (8-16 KiB), through the pool in the 32-64 KiB one.
    if !shmfab::internal::cma::available() {
        return; // No single copy offered: no rendezvous at this size.
    }
    let k = proto::Config::default().cma_min;
    eager_run(k + 1000, "zzeag0", true);
    eager_run(4 * k + 1000, "zzeag2", false);
}

fn eager_run(len: usize, job: &str, inline: bool) {
    let cfg = proto::Config::default();
    let t = pair(cfg.clone(), job);
    let (mut ms, mut rs) = (Vec::new(), Vec::new());
    let msg = page_aligned(&mut ms, len);
    let rb_store = page_aligned(&mut rs, len + 64);
    let rb = &mut rb_store[32..32 + len];
    let stats = |i: usize| t.eps[i].stats().unwrap();
    let eager = |s: shmfab::EpStats| if inline { s.tx_inline } else { s.tx_bounce };
    let (b0, r0) = (eager(stats(1)), stats(1).tx_rndv);
    for i in 0..17usize {
        msg.copy_from_slice(&pattern(len, i));
        // SAFETY: rb and msg outlive the completions taken below.
        unsafe {
            t.eps[0].recv(rb, FI_ADDR_UNSPEC, 1).unwrap();
            t.eps[1].send(msg, t.to0, 2).unwrap();
        }
        take(&t.dom, &t.cqs[1], 1, "send");
        take(&t.dom, &t.cqs[0], 1, "recv");
        assert!(*rb == *msg, "{len} bytes, message {i}");
        let (b, r) = (eager(stats(1)) - b0, stats(1).tx_rndv - r0);
        // Messages 0, 8 and 16 by rendezvous, the others eagerly.
        assert_eq!(r as usize, 1 + i / 8, "{len} bytes: rendezvous after message {i}");
        assert_eq!((b + r) as usize, i + 1, "{len} bytes (eagerly inline: {inline}), after message {i}");
    }
    assert_eq!(stats(0).cma_aliased, 3, "each rendezvous was in the band");
    // A delivery-complete send never goes eagerly (its FIN completes it),
    // and a message outside the eager classes (from 64 KiB) neither.
    let r = stats(1).tx_rndv;
    assert_eq!(one(&t, len, true, false, 1), 1);
    assert_eq!(stats(1).tx_rndv, r + 1);
    let big = 8 * cfg.cma_min;
    let fins = one(&t, big, false, false, 2);
    assert_eq!(stats(1).tx_rndv, r + 2, "64 KiB by rendezvous ({fins} FIN)");
}
