//! A blocked wait still notices dead peers (issue 13): a receive directed
//! at a rank that dies by SIGKILL fails within about a second of the death
//! however the application waits for it, with no timeout anywhere: sread,
//! a counter's wait, a wait set, trywait and poll(2) on an FD wait object,
//! and a completion channel's get_event.

mod common;
use common::{put_file, run_killing, test_dir};
use shmfab::{CqAttr, CqTaggedEntry, ErrorKind, WaitObj, FI_RECV, FI_TRANSMIT};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// How long ago the dying rank died (it wrote the time just before).
fn since_death() -> Duration {
    let t = std::fs::read_to_string(test_dir().join("dying")).expect("the dying rank wrote its time");
    let died: u128 = t.parse().unwrap();
    Duration::from_nanos((now_ns().saturating_sub(died)) as u64)
}

const DEAD: usize = 5;
const CTX: usize = 77;

#[test]
fn blocked_waits_notice_a_peer_that_dies() {
    run_killing("blocked_waits_notice_a_peer_that_dies", DEAD + 1, &[], Duration::from_secs(60), &[DEAD], |w| {
        w.barrier();
        let dead = w.addrs[DEAD];
        let mut b = [0u8; 8];
        let ready = || put_file(&format!("posted{}", w.rank), "");
        let check_err = |cq: &shmfab::CompletionQueue| {
            let e = cq.readerr().expect("an error entry");
            assert_eq!((e.op_context, e.err), (CTX, ErrorKind::Io.errno()), "rank {}", w.rank);
            assert_eq!(e.flags & FI_RECV, FI_RECV);
            let el = since_death();
            assert!(el < Duration::from_secs(2), "rank {}: the failure came {el:?} after the death", w.rank);
        };
        // Another endpoint of the domain, with its own CQ (and counter).
        let endpoint = |cq: &shmfab::CompletionQueue, cntr: Option<&shmfab::Counter>| {
            let ep = w.dom.endpoint().unwrap();
            ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
            if let Some(c) = cntr {
                ep.bind_cntr(c, FI_RECV).unwrap();
            }
            ep.bind_av(&w.av).unwrap();
            ep.enable().unwrap();
            ep
        };
        match w.rank {
            0 => {
                // sread, no timeout.
                // SAFETY: b lives until the completion below.
                unsafe { w.ep.recv(&mut b, dead, CTX).unwrap() };
                ready();
                let mut e = [CqTaggedEntry::default()];
                assert_eq!(w.cq.sread(&mut e, None, None).unwrap_err().kind(), ErrorKind::Avail);
                check_err(&w.cq);
            }
            1 => {
                // A counter's wait, no timeout: its error value moves.
                let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
                let c = w.dom.cntr_open().unwrap();
                let ep = endpoint(&cq, Some(&c));
                // SAFETY: b lives until the completion below.
                unsafe { ep.recv(&mut b, dead, CTX).unwrap() };
                ready();
                assert_eq!(c.wait(1, None).unwrap_err().kind(), ErrorKind::Avail);
                assert_eq!(c.readerr().unwrap(), 1);
                let mut e = [CqTaggedEntry::default()];
                assert_eq!(cq.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
                check_err(&cq);
                drop(ep);
            }
            2 => {
                // A wait set holding the CQ, no timeout.
                let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
                let ws = w.dom.wait_open().unwrap();
                ws.add_cq(&cq).unwrap();
                let ep = endpoint(&cq, None);
                // SAFETY: b lives until the completion below.
                unsafe { ep.recv(&mut b, dead, CTX).unwrap() };
                ready();
                ws.wait(None).unwrap();
                let mut e = [CqTaggedEntry::default()];
                assert_eq!(cq.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
                check_err(&cq);
                drop(ep);
                drop(ws);
            }
            3 => {
                // trywait, then poll(2) on the FD wait object, no timeout.
                let cq = w.dom.cq_open(&CqAttr { wait_obj: WaitObj::Fd, ..Default::default() }).unwrap();
                let ep = endpoint(&cq, None);
                // SAFETY: b lives until the completion below.
                unsafe { ep.recv(&mut b, dead, CTX).unwrap() };
                ready();
                let fd = cq.wait_fd().unwrap();
                loop {
                    let mut e = [CqTaggedEntry::default()];
                    match cq.read(&mut e) {
                        Err(x) if x.kind() == ErrorKind::Avail => break,
                        Err(x) if x.kind() == ErrorKind::Again => {}
                        r => panic!("unexpected read: {r:?}"),
                    }
                    if w.dom.trywait(&[&cq]).is_ok() {
                        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
                        // SAFETY: p is one valid pollfd on our stack.
                        let n = unsafe { libc::poll(&mut p, 1, -1) };
                        assert!(n >= 0, "poll: {}", std::io::Error::last_os_error());
                    }
                }
                check_err(&cq);
                drop(ep);
            }
            4 => {
                // A completion channel's get_event, no timeout (errors fire
                // any arming).
                let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
                let ch = w.dom.channel_open().unwrap();
                cq.attach_channel(&ch, 0xc4).unwrap();
                cq.req_notify(true).unwrap();
                let ep = endpoint(&cq, None);
                // SAFETY: b lives until the completion below.
                unsafe { ep.recv(&mut b, dead, CTX).unwrap() };
                ready();
                assert_eq!(ch.get_event(None).unwrap(), 0xc4);
                ch.ack(1).unwrap();
                let mut e = [CqTaggedEntry::default()];
                assert_eq!(cq.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
                check_err(&cq);
                drop(ep);
                cq.detach_channel().unwrap();
            }
            _ => {
                // Die once every waiter has posted and gone to sleep.
                let t0 = Instant::now();
                while !(0..DEAD).all(|r| test_dir().join(format!("posted{r}")).exists()) {
                    assert!(t0.elapsed() < Duration::from_secs(30), "the waiters never posted");
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(300));
                put_file("dying", &now_ns().to_string());
                // SAFETY: kill on our own pid.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                unreachable!("SIGKILL");
            }
        }
    });
}
