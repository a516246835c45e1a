//! Completion notification as in ibv_req_notify_cq: arming rules (next vs
//! solicited, one event per arming, none for completions already present,
//! next wins), events from another process read blocking and through the
//! channel's fd, acknowledgement.

mod common;
use common::run;
use shmfab::*;
use std::io::IoSlice;
use std::time::{Duration, Instant};

fn drain(cq: &CompletionQueue) {
    let mut e = [CqTaggedEntry::default(); 16];
    loop {
        match cq.read(&mut e) {
            Ok(_) => {}
            Err(x) if x.kind() == ErrorKind::Avail => {
                cq.readerr().unwrap();
            }
            Err(_) => return,
        }
    }
}

#[test]
fn arming_rules() {
    std::env::set_var("SHMFAB_JOB_ID", format!("notify-rules-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain().unwrap();
    let common::Two { ep0, ep1, cq0, cq1, av: _av, a1, .. } = common::two(&dom);
    let ch = dom.channel_open().unwrap();
    assert_eq!(cq1.req_notify(false).unwrap_err().kind(), ErrorKind::Inval, "not attached");
    cq1.attach_channel(&ch, 0x77).unwrap();
    let mut bufs = [[0u8; 8]; 16];
    let mut k = 0;
    let mut recv = |n: usize| {
        for _ in 0..n {
            // SAFETY: bufs outlive every completion (drained before the end).
            unsafe { ep1.recv(&mut bufs[k % 16], FI_ADDR_UNSPEC, k).unwrap() };
            k += 1;
        }
    };
    let solicited = |len: usize| {
        let d = vec![1u8; len];
        let iov = [IoSlice::new(&d)];
        // SAFETY: d lives until the send completes (inline: at once).
        unsafe {
            ep0.sendmsg(&SendMsg { iov: &iov, dest: a1, context: 0, data: 0, tag: 0 }, SHMFAB_SOLICITED).unwrap()
        };
        drain(&cq0);
    };
    // 1. A completion already there when arming gives no event.
    recv(1);
    ep0.inject(b"before", a1).unwrap();
    dom.progress().unwrap();
    cq1.req_notify(false).unwrap();
    assert_eq!(ch.try_get_event().unwrap_err().kind(), ErrorKind::Again, "completion predates the arming");
    drain(&cq1);
    // 2. One event per arming.
    recv(2);
    ep0.inject(b"one", a1).unwrap();
    ep0.inject(b"two", a1).unwrap();
    assert_eq!(ch.try_get_event().unwrap(), 0x77);
    assert_eq!(ch.try_get_event().unwrap_err().kind(), ErrorKind::Again, "one per arming");
    drain(&cq1);
    cq1.req_notify(false).unwrap();
    cq1.req_notify(false).unwrap(); // repeating has no effect
    recv(1);
    ep0.inject(b"three", a1).unwrap();
    assert_eq!(ch.try_get_event().unwrap(), 0x77);
    assert_eq!(ch.try_get_event().unwrap_err().kind(), ErrorKind::Again);
    drain(&cq1);
    // 3. Solicited only: a plain message gives none, a solicited one does.
    cq1.req_notify(true).unwrap();
    recv(2);
    ep0.inject(b"plain", a1).unwrap();
    assert_eq!(ch.try_get_event().unwrap_err().kind(), ErrorKind::Again, "not solicited");
    solicited(4);
    assert_eq!(ch.try_get_event().unwrap(), 0x77);
    drain(&cq1);
    // ... and an error completion (truncation) counts as solicited.
    cq1.req_notify(true).unwrap();
    recv(1);
    ep0.inject(&[0u8; 64], a1).unwrap(); // into an 8-byte buffer
    assert_eq!(ch.try_get_event().unwrap(), 0x77, "error completions notify solicited armings");
    drain(&cq1);
    // 4. "next" wins over "solicited".
    cq1.req_notify(true).unwrap();
    cq1.req_notify(false).unwrap();
    recv(1);
    ep0.inject(b"plain", a1).unwrap();
    assert_eq!(ch.try_get_event().unwrap(), 0x77, "next takes precedence");
    drain(&cq1);
    // 5. Acknowledge, detach, close.
    assert_eq!(ch.close().unwrap_err().kind(), ErrorKind::Busy);
    assert_eq!(ch.ack(100).unwrap_err().kind(), ErrorKind::Inval);
    ch.ack(5).unwrap();
    assert_eq!(ch.close().unwrap_err().kind(), ErrorKind::Busy, "still attached");
    cq1.detach_channel().unwrap();
    ch.close().unwrap();
    drop((ep0, ep1));
}

#[test]
fn events_from_another_process_blocking_and_by_fd() {
    run("events_from_another_process_blocking_and_by_fd", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 1 {
            let ch = w.dom.channel_open().unwrap();
            w.cq.attach_channel(&ch, 5).unwrap();
            let mut bufs = [[0u8; 8]; 2];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs live until the completions are read below.
                unsafe { w.ep.recv(b, w.addrs[0], 100 + i).unwrap() };
            }
            w.cq.req_notify(true).unwrap();
            w.retry(|| w.ep.inject(b"go", w.addrs[0]));
            // Blocking read of the event.
            let t0 = Instant::now();
            assert_eq!(ch.get_event(Some(Duration::from_secs(10))).unwrap(), 5);
            assert!(t0.elapsed() >= Duration::from_millis(50), "not before the solicited send");
            assert_eq!(w.wait_ctx(100).unwrap().0.len, 8);
            // Through the fd: trywait, then poll(2) on it.
            w.cq.req_notify(true).unwrap();
            let ev = loop {
                match ch.trywait() {
                    Ok(()) => {
                        let mut p = libc::pollfd { fd: ch.fd(), events: libc::POLLIN, revents: 0 };
                        // SAFETY: poll on our own fd.
                        let n = unsafe { libc::poll(&mut p, 1, 10_000) };
                        assert_eq!(n, 1, "the fd must become readable");
                    }
                    Err(e) => assert_eq!(e.kind(), ErrorKind::Again),
                }
                if let Ok(c) = ch.try_get_event() {
                    break c;
                }
            };
            assert_eq!(ev, 5);
            assert_eq!(w.wait_ctx(101).unwrap().0.len, 8);
            ch.ack(2).unwrap();
            w.cq.detach_channel().unwrap();
            ch.close().unwrap();
        } else {
            let mut b = [0u8; 2];
            // SAFETY: b lives until the completion below.
            unsafe { w.ep.recv(&mut b, w.addrs[1], 9).unwrap() };
            w.ok(9);
            for i in 0..2 {
                std::thread::sleep(Duration::from_millis(100));
                let d = [7u8; 8];
                let iov = [IoSlice::new(&d)];
                let m = SendMsg { iov: &iov, dest: w.addrs[1], context: 50 + i, data: 0, tag: 0 };
                // SAFETY: d lives until the completion below.
                w.retry(|| unsafe { w.ep.sendmsg(&m, SHMFAB_SOLICITED) });
                w.ok(50 + i);
            }
        }
        w.barrier();
    });
}

/// The verbs pattern as is, across processes: arm, block in poll(2) on the
/// channel's fd, get the event, ack, drain the CQ, re-arm; with neither
/// trywait nor a progress thread (the arming starts what watches the
/// doorbell for the fd).
#[test]
fn the_verbs_pattern_needs_neither_trywait_nor_a_progress_thread() {
    run("the_verbs_pattern_needs_neither_trywait_nor_a_progress_thread", 2, &[], Duration::from_secs(60), |w| {
        const ROUNDS: usize = 3;
        let mut bufs = [[0u8; 8]; ROUNDS];
        let ch = if w.rank == 1 {
            let ch = w.dom.channel_open().unwrap();
            w.cq.attach_channel(&ch, 0x5a).unwrap();
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive the completions drained below.
                unsafe { w.ep.recv(b, w.addrs[0], 100 + i).unwrap() };
            }
            Some(ch)
        } else {
            None
        };
        w.barrier();
        for round in 0..ROUNDS {
            if w.rank == 0 {
                let mut go = [0u8; 1];
                // SAFETY: go lives until the completion below.
                unsafe { w.ep.trecv(&mut go, w.addrs[1], 1 << 40, 0, 200 + round).unwrap() };
                // Rank 1 is asleep in poll(2) by now (most of the time).
                std::thread::sleep(Duration::from_millis(100));
                w.retry(|| w.ep.inject(&[round as u8; 8], w.addrs[1]));
                // Rank 1 took it: then the next round.
                w.ok(200 + round);
            } else {
                let ch = ch.as_ref().unwrap();
                w.cq.req_notify(false).unwrap();
                let mut p = libc::pollfd { fd: ch.fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd for the call.
                let n = unsafe { libc::poll(&mut p, 1, 10_000) };
                assert_eq!(n, 1, "round {round}: the channel's fd became readable");
                assert_eq!(ch.get_event(Some(Duration::from_secs(5))).unwrap(), 0x5a);
                ch.ack(1).unwrap();
                let mut e = [CqTaggedEntry::default()];
                assert_eq!(w.cq.read(&mut e).unwrap(), 1);
                assert_eq!((e[0].op_context, bufs.get(round).copied()), (100 + round, Some([round as u8; 8])));
                // The fd is not readable while no event is left.
                p.revents = 0;
                // SAFETY: as above.
                assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "round {round}: no event left");
                // Tell rank 0 (an inject: no completion in this CQ). The
                // next message may come before the re-arm: the arming then
                // finds it waiting and makes the fd readable at once.
                w.retry(|| w.ep.tinject(&[1], w.addrs[0], 1 << 40));
            }
        }
        if w.rank == 1 {
            drain(&w.cq);
            w.cq.detach_channel().unwrap();
        }
        w.barrier();
    });
}

#[test]
fn a_closed_cqs_handle_arms_nothing_in_its_slots_new_cq() {
    // The slot of a closed CQ taken by a new one: the old handle's channel
    // calls are refused and leave the new CQ as it was.
    std::env::set_var("SHMFAB_JOB_ID", format!("notify-reuse-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain().unwrap();
    let ch = dom.channel_open().unwrap();
    let old = dom.cq_open(&CqAttr::default()).unwrap();
    old.close().unwrap();
    let new = dom.cq_open(&CqAttr::default()).unwrap();
    assert_eq!(old.attach_channel(&ch, 1).unwrap_err().kind(), ErrorKind::Inval);
    assert_eq!(new.req_notify(false).unwrap_err().kind(), ErrorKind::Inval, "the new CQ was not attached");
    new.attach_channel(&ch, 2).unwrap();
    assert_eq!(old.req_notify(false).unwrap_err().kind(), ErrorKind::Inval);
    assert_eq!(old.detach_channel().unwrap_err().kind(), ErrorKind::Inval);
    new.detach_channel().unwrap();
    new.close().unwrap();
}
