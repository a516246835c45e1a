//! Blocking reads as in fi_cq(3) and fi_cntr(3), with the completion made
//! by another process: sread wakes up, times out, honours the threshold
//! condition, is interrupted by cq_signal; cntr_wait; FI_WAIT_NONE refuses.

mod common;
use common::run;
use shmfab::{CqAttr, CqTaggedEntry, ErrorKind, Fabric, WaitCond, WaitObj, FI_RECV, FI_TRANSMIT};
use std::time::{Duration, Instant};

#[test]
fn sread_sleeps_until_another_process_completes_it() {
    run("sread_sleeps_until_another_process_completes_it", 2, &[], Duration::from_secs(60), |w| {
        let mut b = [0u8; 8];
        if w.rank == 1 {
            // SAFETY: b lives until the completion below.
            unsafe { w.ep.recv(&mut b, w.addrs[0], 1).unwrap() };
        }
        w.barrier();
        if w.rank == 0 {
            std::thread::sleep(Duration::from_millis(200));
            w.retry(|| w.ep.inject(b"wake up!", w.addrs[1]));
        } else {
            let sleeps0 = w.dom.sleeps();
            let t0 = Instant::now();
            let mut e = [CqTaggedEntry::default()];
            assert_eq!(w.cq.sread(&mut e, None, Some(Duration::from_secs(10))).unwrap(), 1);
            let el = t0.elapsed();
            assert_eq!((e[0].op_context, &b), (1, b"wake up!"));
            assert!(el >= Duration::from_millis(150) && el < Duration::from_secs(5), "{el:?}");
            assert!(w.dom.sleeps() > sleeps0, "sread slept rather than spun");
        }
        w.barrier();
    });
}

#[test]
fn sread_times_out_and_respects_the_threshold() {
    run("sread_times_out_and_respects_the_threshold", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 1 {
            // An idle CQ: -FI_EAGAIN after the timeout, not before.
            let mut e = [CqTaggedEntry::default(); 8];
            let t0 = Instant::now();
            assert_eq!(
                w.cq.sread(&mut e, None, Some(Duration::from_millis(100))).unwrap_err().kind(),
                ErrorKind::Again
            );
            let el = t0.elapsed();
            assert!(el >= Duration::from_millis(95) && el < Duration::from_secs(2), "{el:?}");
            // Threshold: a CQ with FI_CQ_COND_THRESHOLD waits for 5 entries.
            let cq = w.dom.cq_open(&CqAttr { wait_cond: WaitCond::Threshold, ..Default::default() }).unwrap();
            let ep = w.dom.endpoint().unwrap();
            ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
            ep.bind_av(&w.av).unwrap();
            ep.enable().unwrap();
            let mut bufs = [[0u8; 4]; 5];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs live until the completions below.
                unsafe { ep.recv(b, shmfab::FI_ADDR_UNSPEC, i).unwrap() };
            }
            // Tell rank 0 where to send (our new endpoint's address).
            w.tell(0, &[ep.getname()]);
            let t0 = Instant::now();
            let n = cq.sread(&mut e, Some(5), Some(Duration::from_secs(10))).unwrap();
            assert_eq!(n, 5, "all five at once");
            assert!(t0.elapsed() >= Duration::from_millis(60), "did not return before the fifth");
            drop(ep);
        } else {
            let dest = w.learn(1, 1)[0];
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(20));
                w.retry(|| w.ep.inject(b"tick", dest));
            }
        }
        w.barrier();
    });
}

#[test]
fn cq_signal_interrupts_a_blocked_sread() {
    std::env::set_var("SHMFAB_JOB_ID", format!("waits-signal-{}", std::process::id()));
    for threading in [shmfab::Threading::Domain, shmfab::Threading::Safe] {
        let dom = Fabric::open().unwrap().domain_with(threading).unwrap();
        let (cq, _av, ep) = common::open_endpoint(&dom);
        std::thread::scope(|s| {
            // The owner thread blocks; another thread signals (allowed in
            // FI_THREAD_DOMAIN mode too: signal takes no domain lock).
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(150));
                cq.signal().unwrap();
            });
            let t0 = Instant::now();
            let mut e = [CqTaggedEntry::default()];
            let r = cq.sread(&mut e, None, None);
            let el = t0.elapsed();
            assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::Again), "{threading:?}");
            assert!(el >= Duration::from_millis(100) && el < Duration::from_secs(5), "{el:?}");
        });
        drop(ep);
    }
}

#[test]
fn cntr_wait_and_wait_none() {
    run("cntr_wait_and_wait_none", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 1 {
            let c = w.dom.cntr_open().unwrap();
            let cq = w.dom.cq_open(&CqAttr { wait_obj: WaitObj::None, ..Default::default() }).unwrap();
            let ep = w.dom.endpoint().unwrap();
            ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
            ep.bind_cntr(&c, FI_RECV).unwrap();
            ep.bind_av(&w.av).unwrap();
            ep.enable().unwrap();
            let mut e = [CqTaggedEntry::default()];
            assert_eq!(
                cq.sread(&mut e, None, Some(Duration::from_millis(10))).unwrap_err().kind(),
                ErrorKind::Inval,
                "FI_WAIT_NONE"
            );
            let t0 = Instant::now();
            assert_eq!(c.wait(1, Some(Duration::from_millis(100))).unwrap_err().kind(), ErrorKind::TimedOut);
            assert!(t0.elapsed() >= Duration::from_millis(95));
            let mut bufs = [[0u8; 4]; 10];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs live until the counter says all arrived.
                unsafe { ep.recv(b, shmfab::FI_ADDR_UNSPEC, i).unwrap() };
            }
            w.tell(0, &[ep.getname()]);
            c.wait(10, Some(Duration::from_secs(10))).unwrap();
            assert_eq!(c.read().unwrap(), 10);
            assert!(bufs.iter().all(|b| b == b"tick"));
            drop(ep);
        } else {
            let dest = w.learn(1, 1)[0];
            for _ in 0..10 {
                std::thread::sleep(Duration::from_millis(5));
                w.retry(|| w.ep.inject(b"tick", dest));
            }
        }
        w.barrier();
    });
}

#[test]
fn auto_progress_moves_a_transfer_while_the_application_computes() {
    run("auto_progress_moves_a_transfer_while_the_application_computes", 2, &[], Duration::from_secs(60), |w| {
        const LEN: usize = 1 << 20;
        if w.rank == 1 {
            let dom = Fabric::open().unwrap().domain_with(shmfab::Threading::Safe).unwrap();
            let (cq, av, ep) = common::open_endpoint(&dom);
            let src = av.insert(&[w.av.lookup(w.addrs[0]).unwrap()]).unwrap()[0];
            let mut buf = vec![0u8; LEN];
            // SAFETY: buf lives until the completion read below.
            unsafe { ep.recv(&mut buf, src, 1).unwrap() };
            // A Domain-threaded domain refuses a progress thread.
            assert_eq!(w.dom.start_progress_thread().unwrap_err().kind(), ErrorKind::Inval);
            dom.start_progress_thread().unwrap();
            w.tell(0, &[ep.getname()]);
            // "Compute" without calling into shmfab.
            std::thread::sleep(Duration::from_millis(800));
            let mut e = [CqTaggedEntry::default()];
            assert_eq!(cq.read(&mut e).unwrap(), 1, "the receive completed while we computed");
            assert_eq!(e[0].len, LEN);
            assert!(buf.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
            drop(ep);
        } else {
            let dest = w.learn(1, 1)[0];
            let data: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
            let t0 = Instant::now();
            // SAFETY: data lives until the completion below.
            w.retry(|| unsafe { w.ep.send(&data, dest, 2) });
            w.ok(2);
            let el = t0.elapsed();
            assert!(el < Duration::from_millis(400), "the peer's progress thread completed it: {el:?}");
        }
        w.barrier();
    });
}

#[test]
fn poll_set_reports_exactly_the_right_contexts() {
    run("poll_set_reports_exactly_the_right_contexts", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 1 {
            // Two endpoints with their own CQs, and a receive counter on the second.
            let cq_a = w.dom.cq_open(&CqAttr::default()).unwrap();
            let cq_b = w.dom.cq_open(&CqAttr::default()).unwrap();
            let cn = w.dom.cntr_open().unwrap();
            let (ea, eb) = (w.dom.endpoint().unwrap(), w.dom.endpoint().unwrap());
            ea.bind_cq(&cq_a, FI_TRANSMIT | FI_RECV).unwrap();
            eb.bind_cq(&cq_b, FI_TRANSMIT | FI_RECV).unwrap();
            eb.bind_cntr(&cn, FI_RECV).unwrap();
            for e in [&ea, &eb] {
                e.bind_av(&w.av).unwrap();
                e.enable().unwrap();
            }
            let ps = w.dom.poll_open().unwrap();
            ps.add_cq(&cq_a, 0xa).unwrap();
            ps.add_cq(&cq_b, 0xb).unwrap();
            ps.add_cntr(&cn, 0xc).unwrap();
            assert_eq!(ps.add_cq(&cq_a, 1).unwrap_err().kind(), ErrorKind::Already);
            let mut out = [0usize; 8];
            assert_eq!(ps.poll(&mut out).unwrap(), 0, "nothing yet");
            let mut b = [0u8; 4];
            // SAFETY: b lives until the completion is read below.
            unsafe { eb.recv(&mut b, shmfab::FI_ADDR_UNSPEC, 1).unwrap() };
            w.tell(0, &[eb.getname()]);
            let t0 = Instant::now();
            let n = loop {
                let n = ps.poll(&mut out).unwrap();
                if n > 0 {
                    break n;
                }
                assert!(t0.elapsed() < Duration::from_secs(10));
                w.dom.wait(Some(Duration::from_millis(1)));
            };
            let mut got: Vec<usize> = out[..n].to_vec();
            got.sort();
            assert_eq!(got, vec![0xb, 0xc], "CQ b not empty and counter changed; CQ a untouched");
            // The counter is reported once per change; the CQ while not empty.
            let n = ps.poll(&mut out).unwrap();
            assert_eq!(&out[..n], &[0xb]);
            let mut e = [CqTaggedEntry::default()];
            cq_b.read(&mut e).unwrap();
            assert_eq!(ps.poll(&mut out).unwrap(), 0);
            // Bound: a CQ in a poll set cannot close, a non-empty set cannot either.
            assert_eq!(cq_a.close().unwrap_err().kind(), ErrorKind::Busy);
            assert_eq!(ps.close().unwrap_err().kind(), ErrorKind::Busy);
            ps.del_cq(&cq_a).unwrap();
            ps.del_cq(&cq_b).unwrap();
            ps.del_cntr(&cn).unwrap();
            ps.close().unwrap();
            drop((ea, eb));
        } else {
            let dest = w.learn(1, 1)[0];
            w.retry(|| w.ep.inject(b"poll", dest));
        }
        w.barrier();
    });
}

#[test]
fn wait_set_wakes_on_a_member_and_binds() {
    run("wait_set_wakes_on_a_member_and_binds", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 1 {
            let ws = w.dom.wait_open().unwrap();
            let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
            let ep = w.dom.endpoint().unwrap();
            ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
            ep.bind_av(&w.av).unwrap();
            ep.enable().unwrap();
            ws.add_cq(&cq).unwrap();
            assert_eq!(cq.wait_obj().unwrap(), WaitObj::Set);
            let mut e = [CqTaggedEntry::default()];
            assert_eq!(
                cq.sread(&mut e, None, Some(Duration::from_millis(10))).unwrap_err().kind(),
                ErrorKind::Inval,
                "FI_WAIT_SET CQs wait through the set"
            );
            let t0 = Instant::now();
            assert_eq!(ws.wait(Some(Duration::from_millis(100))).unwrap_err().kind(), ErrorKind::TimedOut);
            assert!(t0.elapsed() >= Duration::from_millis(95));
            let mut b = [0u8; 4];
            // SAFETY: b lives until the completion is read below.
            unsafe { ep.recv(&mut b, shmfab::FI_ADDR_UNSPEC, 3).unwrap() };
            w.tell(0, &[ep.getname()]);
            let sleeps = w.dom.sleeps();
            ws.wait(Some(Duration::from_secs(10))).unwrap();
            assert!(w.dom.sleeps() > sleeps, "waited asleep");
            assert_eq!(cq.read(&mut e).unwrap(), 1);
            assert_eq!(&b, b"wset");
            assert_eq!(cq.close().unwrap_err().kind(), ErrorKind::Busy, "bound to the wait set (and the endpoint)");
            assert_eq!(ws.close().unwrap_err().kind(), ErrorKind::Busy);
            drop(ep);
        } else {
            let dest = w.learn(1, 1)[0];
            std::thread::sleep(Duration::from_millis(100));
            w.retry(|| w.ep.inject(b"wset", dest));
        }
        w.barrier();
    });
}

#[test]
fn yield_wait_object_and_sreadfrom_across_processes() {
    run("yield_wait_object_and_sreadfrom_across_processes", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 1 {
            let cq = w.dom.cq_open(&CqAttr { wait_obj: WaitObj::Yield, ..Default::default() }).unwrap();
            let ep = w.dom.endpoint().unwrap();
            ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
            ep.bind_av(&w.av).unwrap();
            ep.enable().unwrap();
            let mut b = [0u8; 5];
            // SAFETY: b lives until the completion below.
            unsafe { ep.recv(&mut b, shmfab::FI_ADDR_UNSPEC, 4).unwrap() };
            w.tell(0, &[ep.getname()]);
            let mut e = [CqTaggedEntry::default()];
            let mut src = [0u64];
            let t0 = Instant::now();
            assert_eq!(cq.sreadfrom(&mut e, &mut src, None, Some(Duration::from_secs(10))).unwrap(), 1);
            assert!(t0.elapsed() >= Duration::from_millis(50));
            assert_eq!((e[0].op_context, &b), (4, b"yield"));
            assert_eq!(src[0], w.addrs[0], "source of the completion");
            drop(ep);
        } else {
            let dest = w.learn(1, 1)[0];
            std::thread::sleep(Duration::from_millis(100));
            w.retry(|| w.ep.inject(b"yield", dest));
        }
        w.barrier();
    });
}
