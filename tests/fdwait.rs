//! FD wait objects across processes, with the trywait/epoll loop of
//! fi_poll(3): over 100,000 messages from another process, no event is
//! ever missed (a blocked epoll_wait that times out fails the test), and
//! the receiver really blocks (counted).

mod common;
use common::{run, World};
use shmfab::{CompletionQueue, CqAttr, CqTaggedEntry, Endpoint, ErrorKind, WaitObj, FI_RECV, FI_TRANSMIT};
use std::time::Duration;

/// A second endpoint of the rank, with its own CQ of `wait_obj`, bound to
/// the rank's AV and enabled (`size` 0: the default).
fn endpoint_with(w: &World, wait_obj: WaitObj, size: usize) -> (CompletionQueue, Endpoint) {
    let cq = w.dom.cq_open(&CqAttr { wait_obj, size, ..Default::default() }).unwrap();
    let ep = w.dom.endpoint().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&w.av).unwrap();
    ep.enable().unwrap();
    (cq, ep)
}

const N: usize = 100_000;

#[test]
fn trywait_epoll_loop_never_misses_an_event() {
    run("trywait_epoll_loop_never_misses_an_event", 2, &[], Duration::from_secs(240), |w| {
        if w.rank == 1 {
            let (cq, ep) = endpoint_with(&w, WaitObj::Fd, 4096);
            let fd = cq.wait_fd().unwrap();
            // SAFETY: plain epoll system calls on our own fds.
            let ep_fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            assert!(ep_fd >= 0);
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 1 };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::epoll_ctl(ep_fd, libc::EPOLL_CTL_ADD, fd, &mut ev) }, 0);
            // Tell rank 0 where to send.
            w.tell(0, &[ep.getname()]);
            let mut bufs = vec![[0u8; 8]; 256];
            let mut posted = 0usize;
            let mut got = 0usize;
            let mut blocked = 0usize;
            let mut e = [CqTaggedEntry::default(); 64];
            while got < N {
                // Keep receives posted (slot i % 256 is free again once
                // message i - 256 completed).
                while posted < N && posted < got + 256 {
                    let b = &mut bufs[posted % 256];
                    // SAFETY: bufs live for the loop; slot reused only after
                    // its previous receive completed.
                    unsafe { ep.recv(b, shmfab::FI_ADDR_UNSPEC, posted).unwrap() };
                    posted += 1;
                }
                match w.dom.trywait(&[&cq]) {
                    Ok(()) => {
                        let mut out = [libc::epoll_event { events: 0, u64: 0 }];
                        // SAFETY: as above.
                        let n = unsafe { libc::epoll_wait(ep_fd, out.as_mut_ptr(), 1, 5000) };
                        assert!(n == 1, "epoll_wait timed out with {got} of {N} messages: an event was missed");
                        blocked += 1;
                    }
                    Err(x) => assert_eq!(x.kind(), ErrorKind::Again, "{x}"),
                }
                loop {
                    match cq.read(&mut e) {
                        Ok(k) => {
                            for x in &e[..k] {
                                assert_eq!(x.op_context, got, "order");
                                assert_eq!(u64::from_le_bytes(bufs[got % 256]), got as u64);
                                got += 1;
                            }
                        }
                        Err(x) if x.kind() == ErrorKind::Again => break,
                        Err(x) => panic!("{x}"),
                    }
                }
            }
            eprintln!("blocked in epoll {blocked} times over {N} messages");
            assert!(blocked > 500, "the loop must really block: {blocked} times");
            // SAFETY: closing our epoll fd.
            unsafe { libc::close(ep_fd) };
            drop(ep);
        } else {
            let dest = w.learn(1, 1)[0];
            let mut x = 88172645463325252u64;
            let mut i = 0usize;
            while i < N {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let burst = 1 + (x % 40) as usize;
                for _ in 0..burst.min(N - i) {
                    w.retry(|| w.ep.inject(&(i as u64).to_le_bytes(), dest));
                    i += 1;
                }
                match (x >> 8) % 4 {
                    0 => std::thread::sleep(Duration::from_micros((x >> 16) % 300)),
                    1 => std::thread::yield_now(),
                    _ => {}
                }
            }
        }
        w.barrier();
    });
}

#[test]
fn mutex_cond_and_pollfd_wait_objects_wake_on_another_process() {
    run("mutex_cond_and_pollfd_wait_objects_wake_on_another_process", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 1 {
            let (cq_m, em) = endpoint_with(&w, WaitObj::MutexCond, 0);
            let (cq_p, ep) = endpoint_with(&w, WaitObj::PollFd, 0);
            // POLLFD retrieval: too small first, as fi_poll(3) describes.
            let mut nfds = 0;
            assert_eq!(cq_p.wait_pollfd(&mut [], &mut nfds).unwrap_err().kind(), ErrorKind::TooSmall);
            assert_eq!(nfds, 1);
            let mut fds = [libc::pollfd { fd: -1, events: 0, revents: 0 }];
            let change = cq_p.wait_pollfd(&mut fds, &mut nfds).unwrap();
            assert_eq!(cq_p.wait_pollfd(&mut fds, &mut nfds).unwrap(), change, "fd set unchanged");
            assert!(fds[0].fd >= 0);
            let mc = cq_m.wait_mutex_cond().unwrap();
            assert_eq!(cq_m.wait_fd().unwrap_err().kind(), ErrorKind::NoSys);
            let mut b = [[0u8; 4]; 2];
            // SAFETY: b lives until the completions are read below.
            unsafe {
                em.recv(&mut b[0], shmfab::FI_ADDR_UNSPEC, 1).unwrap();
                ep.recv(&mut b[1], shmfab::FI_ADDR_UNSPEC, 2).unwrap();
            }
            // 1. Mutex/condvar: trywait, then wait on the generation.
            let gen = *mc.mutex.lock().unwrap();
            w.tell(0, &[em.getname(), ep.getname()]);
            let mut e = [CqTaggedEntry::default()];
            loop {
                match w.dom.trywait(&[&cq_m]) {
                    Ok(()) => {
                        let g = mc.mutex.lock().unwrap();
                        let (g, to) = mc.cond.wait_timeout_while(g, Duration::from_secs(10), |g| *g == gen).unwrap();
                        assert!(!to.timed_out(), "condvar never signalled (generation {})", *g);
                    }
                    Err(x) => assert_eq!(x.kind(), ErrorKind::Again),
                }
                if cq_m.read(&mut e).is_ok() {
                    break;
                }
            }
            assert_eq!(&b[0], b"cond");
            // 2. POLLFD: trywait, then poll(2) on the retrieved set.
            loop {
                match w.dom.trywait(&[&cq_p]) {
                    Ok(()) => {
                        // SAFETY: poll on our own fd set.
                        assert_eq!(unsafe { libc::poll(fds.as_mut_ptr(), 1, 10_000) }, 1, "pollfd never readable");
                    }
                    Err(x) => assert_eq!(x.kind(), ErrorKind::Again),
                }
                if cq_p.read(&mut e).is_ok() {
                    break;
                }
            }
            assert_eq!(&b[1], b"poll");
            // 3. trywait over a counter (checkpoint) and a wait set.
            let c = w.dom.cntr_open().unwrap();
            c.add(1).unwrap();
            assert_eq!(w.dom.trywait_with(&[], &[&c], &[]).unwrap_err().kind(), ErrorKind::Again, "counter moved");
            w.dom.trywait_with(&[], &[&c], &[]).expect("unchanged since the checkpoint");
            let ws = w.dom.wait_open().unwrap();
            ws.add_cntr(&c).unwrap();
            c.add(1).unwrap();
            assert_eq!(w.dom.trywait_with(&[], &[], &[&ws]).unwrap_err().kind(), ErrorKind::Again, "set has an event");
            drop((em, ep, ws));
        } else {
            let both = w.learn(1, 2);
            let (m, p) = (both[0], both[1]);
            std::thread::sleep(Duration::from_millis(100));
            w.retry(|| w.ep.inject(b"cond", m));
            std::thread::sleep(Duration::from_millis(100));
            w.retry(|| w.ep.inject(b"poll", p));
        }
        w.barrier();
    });
}

/// Completions that the domain's progress thread makes locally, with no
/// doorbell rung by anyone (sends that waited for ring room and went out
/// when the receiver freed it), must make an FD CQ readable too: an
/// application blocked in poll(2) would otherwise sleep through them.
#[test]
fn progress_thread_completions_make_the_fd_readable() {
    let env = [("SHMFAB_THREADING", "safe")];
    run("progress_thread_completions_make_the_fd_readable", 2, &env, Duration::from_secs(60), |w| {
        const N: usize = 300;
        let dir = std::path::PathBuf::from(std::env::var("SHMFAB_TEST_DIR").unwrap());
        if w.rank == 0 {
            let (cq, ep) = endpoint_with(&w, WaitObj::Fd, 4096);
            w.dom.start_progress_thread().unwrap();
            let dest = w.learn(1, 1)[0];
            // Rank 1 does not read yet: its ring fills and the rest of the
            // sends wait in our queue.
            let msg = vec![5u8; 1000];
            for i in 0..N {
                // SAFETY: msg outlives every send completion read below.
                w.retry(|| unsafe { ep.send(&msg, dest, i) });
            }
            let mut done = 0usize;
            let mut e = [CqTaggedEntry::default(); 64];
            let mut read = |done: &mut usize| loop {
                match cq.read(&mut e) {
                    Ok(k) => *done += k,
                    Err(x) if x.kind() == ErrorKind::Again => break,
                    Err(x) => panic!("{x}"),
                }
            };
            read(&mut done);
            assert!(done < N, "the ring took everything ({done}); the test needs queued sends");
            std::fs::write(dir.join("go"), b"").unwrap();
            let fd = cq.wait_fd().unwrap();
            let mut blocked = 0;
            while done < N {
                match w.dom.trywait(&[&cq]) {
                    Ok(()) => {
                        let mut p = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
                        // SAFETY: poll on our own fd.
                        let n = unsafe { libc::poll(p.as_mut_ptr(), 1, 5000) };
                        assert_eq!(n, 1, "fd never readable with {done} of {N} sends complete");
                        blocked += 1;
                    }
                    Err(x) => assert_eq!(x.kind(), ErrorKind::Again, "{x}"),
                }
                read(&mut done);
            }
            eprintln!("blocked {blocked} times");
            std::fs::write(dir.join("done"), b"").unwrap();
            drop(ep);
        } else {
            w.tell(0, &[w.ep.getname()]);
            // Wait (without driving progress) until rank 0 is blocked-ready.
            let t0 = std::time::Instant::now();
            while !dir.join("go").exists() {
                assert!(t0.elapsed() < Duration::from_secs(30));
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(100));
            // Now take everything, slowly enough that rank 0 blocks between.
            let mut b = vec![0u8; 1000];
            for i in 0..N {
                // SAFETY: b lives until the completion below.
                unsafe { w.ep.recv(&mut b, shmfab::FI_ADDR_UNSPEC, 7).unwrap() };
                w.ok(7);
                if i % 50 == 0 {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            // Never send anything to rank 0: only our consuming frees room.
            while !dir.join("done").exists() {
                assert!(t0.elapsed() < Duration::from_secs(50));
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
}
