//! What manual progress means for a peer that does not call in: a large
//! receive (from `split_min`, 512 KiB) is copied by both sides at once, so
//! it waits for its sender's next call into shmfab; with auto progress on
//! at the sender, it completes while the sender computes.

mod common;
use common::{pattern, run};
use shmfab::{CqTaggedEntry, ErrorKind, Fabric};
use std::time::{Duration, Instant};

const LEN: usize = 1 << 20;

#[test]
fn a_large_receive_waits_for_a_sleeping_sender_unless_it_runs_auto_progress() {
    let name = "a_large_receive_waits_for_a_sleeping_sender_unless_it_runs_auto_progress";
    run(name, 2, &[], Duration::from_secs(60), |w| {
        // The sender's domain: thread-safe, so that it may run a progress
        // thread in the second round.
        let (dom, cq, ep, peer) = if w.rank == 1 {
            let dom = Fabric::open().unwrap().domain_with(shmfab::Threading::Safe).unwrap();
            let (cq, av, ep) = common::open_endpoint(&dom);
            let peer = av.insert(&[w.av.lookup(w.addrs[0]).unwrap()]).unwrap()[0];
            w.tell(0, &[ep.getname()]);
            (Some(dom), Some(cq), Some(ep), peer)
        } else {
            (None, None, None, w.learn(1, 1)[0])
        };
        let wait_send = |ctx: usize| {
            let (dom, cq) = (dom.as_ref().unwrap(), cq.as_ref().unwrap());
            let (e, _) = common::next_completion(dom, cq, Duration::from_secs(30), "send")
                .unwrap_or_else(|e| panic!("send failed: {e:?}"));
            assert_eq!(e.op_context, ctx);
        };
        // Round 0, both calling in: a 64 KiB single copy shows the kernel
        // allows it between these two processes (then the split copy is
        // used for large messages).
        // Both buffers page-aligned: never in the kernel copy's slow band
        // (which would send it through the pool: shmfab::copy).
        let (mut sv, mut rv) = (vec![0u8; (64 << 10) + 4096], vec![0u8; (64 << 10) + 4096]);
        let (so, ro) = (sv.as_ptr().align_offset(4096), rv.as_ptr().align_offset(4096));
        let small = &mut sv[so..so + (64 << 10)];
        small.copy_from_slice(&pattern(64 << 10, 1));
        let rsmall = &mut rv[ro..ro + (64 << 10)];
        if w.rank == 0 {
            // SAFETY: rsmall lives until the completion below.
            unsafe { w.ep.recv(rsmall, peer, 10).unwrap() };
            w.ok(10);
            assert_eq!(rsmall, small);
        } else {
            // SAFETY: small lives until the completion below.
            unsafe { ep.as_ref().unwrap().send(small, peer, 11).unwrap() };
            wait_send(11);
        }
        let cma = w.ep.stats().unwrap().cma_reads > 0;
        w.barrier();
        for auto in [false, true] {
            let data = pattern(LEN, 2 + auto as u64);
            let mut buf = vec![0u8; LEN];
            if w.rank == 1 {
                let ep = ep.as_ref().unwrap();
                if auto {
                    dom.as_ref().unwrap().start_progress_thread().unwrap();
                }
                // SAFETY: data lives until the completion below.
                unsafe { ep.send(&data, peer, 20).unwrap() };
                // Compute without calling into shmfab.
                std::thread::sleep(Duration::from_millis(1500));
                std::fs::write(common::test_dir().join("woke"), b"").unwrap();
                wait_send(20);
            } else {
                // SAFETY: buf lives until the completion below.
                unsafe { w.ep.recv(&mut buf, peer, 21).unwrap() };
                let t0 = Instant::now();
                let mut e = [CqTaggedEntry::default()];
                let done = loop {
                    match w.cq.read(&mut e) {
                        Ok(_) => break true,
                        Err(x) if x.kind() == ErrorKind::Again => {}
                        Err(x) => panic!("receive: {x}"),
                    }
                    if !auto && t0.elapsed() > Duration::from_millis(700) {
                        break false;
                    }
                    assert!(t0.elapsed() < Duration::from_secs(30), "receive never completed");
                };
                let woke = common::test_dir().join("woke").exists();
                if auto {
                    assert!(done && !woke, "with auto progress the receive completes while the sender sleeps");
                } else if cma {
                    assert!(!done, "without auto progress the receive waits for the sleeping sender");
                    let _ = w.ok(21);
                } else {
                    // No single copy here: the data goes through the pool,
                    // which also needs the sender; only completion is checked.
                    if !done {
                        w.ok(21);
                    }
                }
                assert_eq!(buf, data);
                if !auto {
                    // The sender woke (it wrote the mark before its call in).
                    std::fs::remove_file(common::test_dir().join("woke")).unwrap();
                }
            }
            w.barrier();
        }
        drop(ep);
    });
}
