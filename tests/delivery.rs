//! FI_DELIVERY_COMPLETE on sends, across real processes: a send completes
//! only once the receiver has the data in its buffer, whatever its size
//! and path (inline sizes, the pool, single copy), and also when the
//! message waited unexpected; a discarded message completes its send; a
//! receiver that exits without taking it fails it in bounded time.

mod common;
use common::{pattern, run, World};
use shmfab::{ErrorKind, RecvMsg, SendMsg, FI_COMPLETION, FI_DELIVERY_COMPLETE, FI_DISCARD, FI_PEEK};
use std::io::{IoSlice, IoSliceMut};
use std::time::{Duration, Instant};

const SIZES: [usize; 6] = [0, 8, 1000, 4096, 70000, 600000];
const GO: u64 = 1 << 40;
const LATE: u64 = 1 << 41;
const DROP: u64 = 1 << 42;

/// Rank 0 sends one delivery-complete message of each size (tag = index)
/// before rank 1 has posted anything, checks that none completes while
/// rank 1 holds off (200 ms, its receives not posted), then tells rank 1
/// to go; rank 1 receives and checks them. Then a message rank 1 discards
/// (FI_PEEK | FI_DISCARD: its send completes), and one rank 1 never takes
/// (its send fails once rank 1 is gone).
fn held_until_delivered(w: &World) {
    let peer = w.addrs[1 - w.rank];
    if w.rank == 0 {
        let msgs: Vec<Vec<u8>> = SIZES.iter().enumerate().map(|(i, &n)| pattern(n, 77 + i as u64)).collect();
        for (i, m) in msgs.iter().enumerate() {
            let iov = [IoSlice::new(m)];
            let sm = SendMsg { iov: &iov, dest: peer, context: 100 + i, data: 0, tag: i as u64 };
            // SAFETY: msgs outlives every completion waited for below.
            w.retry(|| unsafe { w.ep.tsendmsg(&sm, FI_DELIVERY_COMPLETE | FI_COMPLETION) });
        }
        // Nothing may complete while the receiver has posted nothing.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            let mut e = [shmfab::CqTaggedEntry::default()];
            match w.cq.read(&mut e) {
                Err(x) if x.kind() == ErrorKind::Again => {}
                other => panic!("a delivery-complete send completed before its receive was posted: {other:?}"),
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        w.retry(|| w.ep.tinject(b"go", peer, GO));
        for i in 0..SIZES.len() {
            w.ok(100 + i);
        }
        // Discarded by the receiver: the send completes.
        let d = pattern(5000, 9);
        let iov = [IoSlice::new(&d)];
        let sm = SendMsg { iov: &iov, dest: peer, context: 200, data: 0, tag: DROP };
        // SAFETY: d outlives the completion.
        w.retry(|| unsafe { w.ep.tsendmsg(&sm, FI_DELIVERY_COMPLETE | FI_COMPLETION) });
        w.ok(200);
        // Never received: rank 1 exits; the send fails in bounded time.
        let l = pattern(64, 3);
        let iov = [IoSlice::new(&l)];
        let sm = SendMsg { iov: &iov, dest: peer, context: 300, data: 0, tag: LATE };
        // SAFETY: l outlives the completion.
        w.retry(|| unsafe { w.ep.tsendmsg(&sm, FI_DELIVERY_COMPLETE | FI_COMPLETION) });
        w.retry(|| w.ep.tinject(b"bye", peer, GO + 1));
        let t0 = Instant::now();
        let e = w.wait_ctx(300).expect_err("a send nobody received completed successfully");
        assert!(t0.elapsed() < Duration::from_secs(20), "the failure took {:?}", t0.elapsed());
        assert_ne!(e.err, 0);
    } else {
        let mut go = [0u8; 8];
        // SAFETY: go outlives its completion.
        unsafe { w.ep.trecv(&mut go, peer, GO, 0, 1).unwrap() };
        w.ok(1);
        let mut bufs: Vec<Vec<u8>> = SIZES.iter().map(|&n| vec![0u8; n]).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            // SAFETY: bufs outlives the completions.
            unsafe { w.ep.trecv(b, peer, i as u64, 0, 10 + i).unwrap() };
        }
        for (i, &n) in SIZES.iter().enumerate() {
            let e = w.ok(10 + i);
            assert_eq!(e.len, n);
            assert_eq!(bufs[i], pattern(n, 77 + i as u64), "size {n}");
        }
        // The DROP message: found and dropped.
        let t0 = Instant::now();
        loop {
            let mut m = RecvMsg { iov: &mut [IoSliceMut::new(&mut [])], src: peer, context: 20, tag: DROP, ignore: 0 };
            // SAFETY: no buffer.
            unsafe { w.ep.trecvmsg(&mut m, FI_PEEK | FI_DISCARD).unwrap() };
            match w.wait_ctx(20) {
                Ok(_) => break,
                Err(e) if e.err == ErrorKind::NoMsg.errno() => {
                    assert!(t0.elapsed() < Duration::from_secs(20), "the message to discard never came");
                }
                Err(e) => panic!("peek: {e:?}"),
            }
        }
        let mut bye = [0u8; 8];
        // SAFETY: bye outlives its completion.
        unsafe { w.ep.trecv(&mut bye, peer, GO + 1, 0, 2).unwrap() };
        w.ok(2);
        // Leave the LATE message untaken.
    }
}

#[test]
fn delivery_complete_sends() {
    run("delivery_complete_sends", 2, &[], Duration::from_secs(60), |w| held_until_delivered(&w));
}

#[test]
fn delivery_complete_sends_without_single_copy() {
    run("delivery_complete_sends_without_single_copy", 2, &[("SHMFAB_CMA", "off")], Duration::from_secs(60), |w| {
        held_until_delivered(&w)
    });
}
