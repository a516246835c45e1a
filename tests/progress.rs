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

/// A CQ read returns the entries its CQ holds without a progress pass, but
/// never more than a few reads in a row: a caller whose CQ is never empty
/// when it reads (a write into the shared heap completes in its call)
/// still has its inbound messages handled. Two domains of one process.
#[test]
fn reads_of_a_never_empty_cq_still_make_progress() {
    use shmfab::{CqAttr, FI_ADDR_UNSPEC, FI_READ, FI_RECV, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_TRANSMIT, FI_WRITE};
    std::env::set_var("SHMFAB_JOB_ID", format!("cq-never-empty-{}", std::process::id()));
    let fab = Fabric::open().unwrap();
    let (d0, d1) = (fab.domain().unwrap(), fab.domain().unwrap());
    let (cq0, cq1) = (d0.cq_open(&CqAttr::default()).unwrap(), d1.cq_open(&CqAttr::default()).unwrap());
    let (av0, av1) = (d0.av_open().unwrap(), d1.av_open().unwrap());
    let (ep0, ep1) = (d0.endpoint().unwrap(), d1.endpoint().unwrap());
    for (ep, cq, av) in [(&ep0, &cq0, &av0), (&ep1, &cq1, &av1)] {
        ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(av).unwrap();
        ep.enable().unwrap();
    }
    let heap = d1.alloc_shared(4096, FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE).unwrap();
    let a1 = av0.insert(&[ep1.getname()]).unwrap()[0];
    let a0 = av1.insert(&[ep0.getname()]).unwrap()[0];
    let mut buf = [0u8; 8];
    // SAFETY: buf outlives the loop below, which reads its completion.
    unsafe { ep0.trecv(&mut buf, FI_ADDR_UNSPEC, 9, 0, 7).unwrap() };
    ep1.tinject(b"inbound!", a0, 9).unwrap();
    let mut e = [CqTaggedEntry::default(); 1];
    let mut found = None;
    for i in 0..1000u64 {
        // One entry queued by the call itself, so the CQ is never empty
        // when read.
        ep0.write(&i.to_ne_bytes(), a1, 0, heap.key(), 100 + i as usize).unwrap();
        let n = cq0.read(&mut e).unwrap();
        assert_eq!(n, 1);
        if e[0].op_context == 7 {
            found = Some(i);
            break;
        }
        assert_eq!(e[0].op_context, 100 + i as usize, "write completions in order");
    }
    let at = found.expect("the inbound message was never handled: reads skipped progress for ever");
    // A pass at least every ninth read; the receive's entry queues behind
    // the write of the read whose pass found it.
    assert!(at <= 18, "the receive completed only at read {at}");
    assert_eq!(&buf, b"inbound!");
    drop(heap);
}
