//! FI_DELIVERY_COMPLETE sends in one process (found correct by review,
//! kept as tests): more than 3 segments over an overflow queue (gathered
//! into one copy: an RTS there names at most 3), and sends into a
//! multi-receive buffer. tests/delivery.rs has the two-process cases.

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
            Err(x) => {
                let ee = cq.readerr();
                panic!("{what}: {x} {ee:?}")
            }
        }
    }
    got
}

/// One ring slot per receiver: the second sender goes through the
/// overflow queue.
#[test]
fn dc_over_overflow_queue_many_iovs() {
    std::env::set_var("SHMFAB_JOB_ID", format!("zzdc-{}", std::process::id()));
    std::env::set_var("SHMFAB_RING_SLOTS", "1");
    let dom = Fabric::open().unwrap().domain_with(Threading::Domain).unwrap();
    let cqs: Vec<_> = (0..3).map(|_| dom.cq_open(&CqAttr::default()).unwrap()).collect();
    let av = dom.av_open().unwrap();
    let eps: Vec<_> = (0..3).map(|_| dom.endpoint().unwrap()).collect();
    for (ep, cq) in eps.iter().zip(&cqs) {
        ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
    }
    let a = av.insert(&[eps[0].getname()]).unwrap()[0];
    // ep1 takes the one ring slot.
    let mut r = [0u8; 8];
    // SAFETY: r outlives its completion (taken below).
    unsafe { eps[0].recv(&mut r, FI_ADDR_UNSPEC, 1).unwrap() };
    eps[1].inject(&[1; 8], a).unwrap();
    take(&dom, &cqs[0], 1, "first");
    for len in [8usize, 3000, 200_000] {
        let segs: Vec<Vec<u8>> = (0..4).map(|i| (0..len).map(|j| (i * 31 + j) as u8).collect()).collect();
        let iov: Vec<IoSlice> = segs.iter().map(|s| IoSlice::new(s)).collect();
        let mut rb = vec![0u8; 4 * len];
        // SAFETY: rb and segs outlive the completions taken below.
        unsafe {
            eps[0].recv(&mut rb, FI_ADDR_UNSPEC, 2).unwrap();
            let m = SendMsg { iov: &iov, dest: a, context: 3, data: 0, tag: 0 };
            eps[2].sendmsg(&m, FI_DELIVERY_COMPLETE | FI_COMPLETION).unwrap();
        }
        take(&dom, &cqs[2], 1, "dc send");
        take(&dom, &cqs[0], 1, "recv");
        assert_eq!(rb, segs.concat(), "len {len}");
        assert!(eps[0].stats().unwrap().rx_ovf > 0, "overflow used");
    }
}

/// Three sizes (inline, pool, rendezvous) into one multi-receive buffer.
#[test]
fn dc_into_multi_recv() {
    std::env::set_var("SHMFAB_JOB_ID", format!("zzdcm-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain_with(Threading::Domain).unwrap();
    let cqs: Vec<_> = (0..2).map(|_| dom.cq_open(&CqAttr::default()).unwrap()).collect();
    let av = dom.av_open().unwrap();
    let eps: Vec<_> = (0..2).map(|_| dom.endpoint().unwrap()).collect();
    for (ep, cq) in eps.iter().zip(&cqs) {
        ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
    }
    let a = av.insert(&[eps[0].getname()]).unwrap()[0];
    let mut buf = vec![0u8; 1 << 20];
    // SAFETY: buf outlives every completion (taken below).
    unsafe {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let mut m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 7, tag: 0, ignore: 0 };
        eps[0].recvmsg(&mut m, FI_MULTI_RECV).unwrap();
    }
    let msgs: Vec<Vec<u8>> =
        [8usize, 5000, 300_000].iter().map(|&n| (0..n).map(|j| (j * 7 + n) as u8).collect()).collect();
    for (i, m) in msgs.iter().enumerate() {
        let iov = [IoSlice::new(m)];
        let sm = SendMsg { iov: &iov, dest: a, context: 100 + i, data: 0, tag: 0 };
        // SAFETY: msgs outlive the completions taken below.
        unsafe { eps[1].sendmsg(&sm, FI_DELIVERY_COMPLETE | FI_COMPLETION).unwrap() };
    }
    take(&dom, &cqs[1], 3, "dc sends");
    let got = take(&dom, &cqs[0], 3, "recvs");
    for (e, m) in got.iter().zip(&msgs) {
        let off = e.buf - buf.as_ptr() as usize;
        assert_eq!(&buf[off..off + m.len()], &m[..]);
    }
}
