//! Shared receive queues across processes: several senders into one SRQ
//! shared by several endpoints, the iov fill rules, cookies, per-connection
//! order, truncation, the low-watermark event, resize under load, flush at
//! endpoint close (and give-back at a discarding close), back-pressure when the SRQ is empty, solicited wait, and
//! the object rules (Busy close, refused posts, cancel); tagged SRQ
//! receives across endpoints and senders (unexpected then posted, ignore
//! masks, peek/claim/discard), directed ones with per-endpoint AVs,
//! multi-receive buffers, cancel of each kind, and tagged buffers given
//! back at a discarding close.

mod common;
use common::{pattern, run, World};
use shmfab::*;
use std::io::{IoSlice, IoSliceMut};
use std::time::{Duration, Instant};

/// The receiver's SRQ side: endpoints bound to one SRQ, one receive CQ.
struct SrqSide {
    // Field order is drop order: endpoints before what they are bound to.
    eps: Vec<Endpoint>,
    srq: SharedRecvQueue,
    cq: CompletionQueue,
}

fn srq_side(w: &World, n_eps: usize, attr: SrqAttr) -> SrqSide {
    let cq = w.dom.cq_open(&CqAttr { size: 1 << 16, ..Default::default() }).unwrap();
    let srq = w.dom.srq_open(&attr).unwrap();
    let eps = common::srq_endpoints(w, n_eps, &cq, &srq);
    SrqSide { eps, srq, cq }
}

impl SrqSide {
    fn addrs(&self) -> Vec<Address> {
        self.eps.iter().map(|e| e.getname()).collect()
    }
}

/// One completion from `cq`, driving progress and sleeping between tries.
fn next(dom: &Domain, cq: &CompletionQueue) -> std::result::Result<(CqTaggedEntry, FiAddr), CqErrEntry> {
    common::next_completion(dom, cq, Duration::from_secs(60), "no completion")
}

/// Whether `cq` stays empty over `ms` of progress.
fn stays_empty(dom: &Domain, cq: &CompletionQueue, ms: u64) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(ms) {
        let mut e = [CqTaggedEntry::default()];
        match cq.read(&mut e) {
            Err(x) if x.kind() == ErrorKind::Again => dom.wait(Some(Duration::from_millis(1))),
            _ => return false,
        }
    }
    true
}

/// Message header: sender rank, destination endpoint, sequence number.
fn header(sender: usize, ep: usize, seq: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&(sender as u32).to_le_bytes());
    h[4..8].copy_from_slice(&(ep as u32).to_le_bytes());
    h[8..].copy_from_slice(&seq.to_le_bytes());
    h
}

fn parse(b: &[u8]) -> (usize, usize, u64) {
    (
        u32::from_le_bytes(b[..4].try_into().unwrap()) as usize,
        u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize,
        u64::from_le_bytes(b[8..16].try_into().unwrap()),
    )
}

/// A message: header then a pattern seeded by it.
fn message(sender: usize, ep: usize, seq: u64, len: usize) -> Vec<u8> {
    let mut m = pattern(len.max(16), seq ^ ((sender as u64) << 40) ^ ((ep as u64) << 32));
    m[..16].copy_from_slice(&header(sender, ep, seq));
    m.truncate(len.max(16));
    m
}

/// Sends with retries on -FI_EAGAIN (progress between tries); returns
/// the number of -FI_EAGAIN seen.
fn send_retry(w: &World, ep: &Endpoint, buf: &[u8], dest: FiAddr, ctx: usize) -> usize {
    // SAFETY: every caller waits for the send completions (or drains its CQ)
    // before the buffer goes.
    w.retry(|| unsafe { ep.send(buf, dest, ctx) })
}

/// Sends `n` messages made by `make(seq)` (payload, destination), at most
/// `window` in flight: their buffers are kept until their completions.
fn stream(w: &World, n: u64, window: usize, mut make: impl FnMut(u64) -> (Vec<u8>, FiAddr)) {
    let mut inflight: Vec<Vec<u8>> = Vec::new();
    for seq in 0..n {
        let (m, dest) = make(seq);
        inflight.push(m);
        send_retry(w, &w.ep, inflight.last().unwrap(), dest, seq as usize);
        if inflight.len() == window {
            for _ in 0..window {
                w.next().unwrap();
            }
            inflight.clear();
        }
    }
    for _ in 0..inflight.len() {
        w.next().unwrap();
    }
}

/// Size of message `seq`: mostly small, some through the pool or by
/// rendezvous.
fn size_of(seq: u64) -> usize {
    match seq % 97 {
        0 => 200_000,
        1 | 2 => 20_000,
        3..=10 => 1000,
        _ => 16 + (seq % 48) as usize,
    }
}

#[test]
fn four_senders_into_one_srq_of_four_endpoints() {
    const PER_SENDER: u64 = 25_000; // 100,000 messages in all
    const BUFS: usize = 128;
    const BUF: usize = 256 * 1024;
    run("four_senders_into_one_srq_of_four_endpoints", 5, &[("SHMFAB_MAX_EPS", "8")], Duration::from_secs(240), |w| {
        if w.rank == 0 {
            let side = srq_side(&w, 4, SrqAttr { max_recv: BUFS, low_watermark: 0 });
            for r in 1..5 {
                w.tell(r, &side.addrs());
            }
            let mut bufs = vec![vec![0u8; BUF]; BUFS];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive every completion (all read below).
                unsafe { side.srq.post(b, i).unwrap() };
            }
            // next[sender][ep]: expected sequence number per connection.
            let mut want = [[0u64; 4]; 5];
            let mut per_ep = [0u64; 4];
            for _ in 0..4 * PER_SENDER {
                let (e, src) = next(&w.dom, &side.cq).unwrap_or_else(|e| panic!("error completion {e:?}"));
                assert_eq!(e.flags & (FI_RECV | FI_MSG), FI_RECV | FI_MSG);
                let i = e.op_context;
                let b = &bufs[i];
                let (s, ep, seq) = parse(b);
                assert!((1..5).contains(&s) && ep < 4, "bad header {s} {ep}");
                assert_eq!(src, w.addrs[s], "source of a message from rank {s}");
                assert_eq!(seq, want[s][ep], "connection {s}->{ep} out of order");
                want[s][ep] += 1;
                per_ep[ep] += 1;
                assert_eq!(e.len, size_of(seq).max(16));
                assert_eq!(e.buf, b.as_ptr() as usize);
                assert!(b[..e.len] == message(s, ep, seq, e.len)[..], "payload {s}->{ep} #{seq}");
                // SAFETY: as above.
                unsafe { side.srq.post(&mut bufs[i], i).unwrap() };
            }
            assert!(per_ep.iter().all(|&n| n == PER_SENDER), "per endpoint: {per_ep:?}");
            assert!(stays_empty(&w.dom, &side.cq, 50), "no extra completion");
            let info = side.srq.query().unwrap();
            assert_eq!((info.posted, info.max_recv, info.endpoints), (BUFS, BUFS, 4));
            w.barrier();
        } else {
            let eps = w.learn(0, 4);
            // Round robin over the four endpoints: message seq goes to
            // endpoint seq % 4 as that connection's number seq / 4.
            stream(&w, PER_SENDER, 256, |seq| {
                let k = (seq % 4) as usize;
                (message(w.rank, k, seq / 4, size_of(seq / 4)), eps[k])
            });
            w.barrier();
        }
    });
}

/// Segment layouts and their boundaries.
fn layouts() -> Vec<Vec<usize>> {
    vec![
        vec![64],
        vec![100_000],
        vec![10, 30],
        vec![5000, 70_000],
        (1..=16).collect(),
        (0..16).map(|i| 4096 + 512 * i).collect(),
    ]
}

/// Message lengths around every boundary of a layout (up to one past the
/// total: that one truncates).
fn lengths(segs: &[usize]) -> Vec<usize> {
    let mut v = vec![0, 1];
    let mut at = 0;
    for s in segs {
        at += s;
        v.extend([at.saturating_sub(1), at, at + 1]);
    }
    v.sort();
    v.dedup();
    v
}

fn iov_fill_rules(test: &str, cma: &str) {
    run(test, 2, &[("SHMFAB_CMA", cma)], Duration::from_secs(120), |w| {
        const SENTINEL: u8 = 0xEE;
        if w.rank == 0 {
            let side = srq_side(&w, 1, SrqAttr { max_recv: 64, low_watermark: 0 });
            w.tell(1, &side.addrs());
            for segs in layouts() {
                let total: usize = segs.iter().sum();
                for len in lengths(&segs) {
                    // The buffer under test, then a neighbour that the
                    // next message (a 16-byte marker) fills.
                    let mut parts: Vec<Vec<u8>> = segs.iter().map(|&n| vec![SENTINEL; n]).collect();
                    let mut next_buf = vec![SENTINEL; 64];
                    {
                        let mut iov: Vec<IoSliceMut> = parts.iter_mut().map(|p| IoSliceMut::new(p)).collect();
                        // SAFETY: parts and next_buf live until both
                        // completions are read below.
                        unsafe {
                            side.srq.post_recv(&mut iov, 0xC0).unwrap();
                            side.srq.post(&mut next_buf, 0xC1).unwrap();
                        }
                    }
                    w.barrier(); // the sender may send now
                    let sent = pattern(len, len as u64);
                    match next(&w.dom, &side.cq) {
                        Ok((e, _)) => {
                            assert!(len <= total, "{segs:?} len {len}: should have truncated");
                            assert_eq!((e.op_context, e.len), (0xC0, len));
                        }
                        Err(e) => {
                            assert!(len > total, "{segs:?} len {len}: unexpected error {e:?}");
                            assert_eq!(e.op_context, 0xC0);
                            assert_eq!(e.err, ErrorKind::Trunc.errno());
                            assert_eq!(e.olen, len - total);
                        }
                    }
                    // Front segments full, at most one partly, the rest
                    // untouched.
                    let mut at = 0;
                    for (k, p) in parts.iter().enumerate() {
                        let n = len.min(at + p.len()).saturating_sub(at).min(p.len());
                        assert!(n == 0 || p[..n] == sent[at..at + n], "{segs:?} len {len}: segment {k} content");
                        assert!(p[n..].iter().all(|&b| b == SENTINEL), "{segs:?} len {len}: segment {k} tail touched");
                        at += p.len();
                    }
                    let (e, _) = next(&w.dom, &side.cq).unwrap();
                    assert_eq!((e.op_context, e.len), (0xC1, 16));
                    assert!(next_buf[..16] == pattern(16, 99)[..], "neighbour buffer");
                    assert!(next_buf[16..].iter().all(|&b| b == SENTINEL), "neighbour buffer tail");
                }
            }
            w.barrier();
        } else {
            let dest = w.learn(0, 1)[0];
            for segs in layouts() {
                for len in lengths(&segs) {
                    w.barrier();
                    let m = pattern(len, len as u64);
                    send_retry(&w, &w.ep, &m, dest, 1);
                    let marker = pattern(16, 99);
                    send_retry(&w, &w.ep, &marker, dest, 2);
                    // A truncated receive still completes the send.
                    w.ok(1);
                    w.ok(2);
                }
            }
            w.barrier();
        }
    });
}

#[test]
fn iov_fill_rules_single_copy() {
    iov_fill_rules("iov_fill_rules_single_copy", "on");
}

#[test]
fn iov_fill_rules_through_the_pool() {
    iov_fill_rules("iov_fill_rules_through_the_pool", "off");
}

#[test]
fn cookies_come_back_as_given() {
    run("cookies_come_back_as_given", 2, &[], Duration::from_secs(60), |w| {
        const N: usize = 64;
        if w.rank == 0 {
            let side = srq_side(&w, 1, SrqAttr { max_recv: N, low_watermark: 0 });
            w.tell(1, &side.addrs());
            let mut bufs = vec![[0u8; 32]; N];
            // Cookies: 0..8 each used 8 times, one odd one (usize::MAX).
            let cookie = |i: usize| if i == N - 1 { usize::MAX } else { i % 8 };
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive the completions read below.
                unsafe { side.srq.post(b, cookie(i)).unwrap() };
            }
            w.barrier();
            // Buffers are taken in posting order: completion i is buffer i.
            for (i, b) in bufs.iter().enumerate() {
                let (e, _) = next(&w.dom, &side.cq).unwrap();
                assert_eq!(e.op_context, cookie(i));
                assert_eq!(e.buf, b.as_ptr() as usize);
                assert_eq!(parse(b).2, i as u64);
            }
            w.barrier();
        } else {
            let dest = w.learn(0, 1)[0];
            w.barrier();
            for i in 0..N {
                w.retry(|| w.ep.inject(&header(1, 0, i as u64), dest));
            }
            w.barrier();
        }
    });
}

#[test]
fn per_connection_order_over_100k_messages() {
    run("per_connection_order_over_100k_messages", 2, &[], Duration::from_secs(120), |w| {
        const N: u64 = 100_000;
        if w.rank == 0 {
            let side = srq_side(&w, 1, SrqAttr { max_recv: 256, low_watermark: 0 });
            w.tell(1, &side.addrs());
            let mut bufs = vec![vec![0u8; 256 * 1024]; 256];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive every completion read below.
                unsafe { side.srq.post(b, i).unwrap() };
            }
            for want in 0..N {
                let (e, _) = next(&w.dom, &side.cq).unwrap();
                let i = e.op_context;
                let (_, _, seq) = parse(&bufs[i]);
                assert_eq!(seq, want, "order");
                assert_eq!(e.len, size_of(seq).max(16));
                if seq % 97 < 3 {
                    assert!(bufs[i][..e.len] == message(1, 0, seq, e.len)[..], "payload #{seq}");
                }
                // SAFETY: as above.
                unsafe { side.srq.post(&mut bufs[i], i).unwrap() };
            }
            w.barrier();
        } else {
            let dest = w.learn(0, 1)[0];
            stream(&w, N, 512, |seq| (message(1, 0, seq, size_of(seq)), dest));
            w.barrier();
        }
    });
}

#[test]
fn low_watermark_event_once_per_arming() {
    run("low_watermark_event_once_per_arming", 2, &[], Duration::from_secs(60), |w| {
        if w.rank == 0 {
            let side = srq_side(&w, 2, SrqAttr { max_recv: 16, low_watermark: 4 });
            w.tell(1, &side.addrs());
            let mut bufs = vec![[0u8; 32]; 16];
            // Buffers are reposted in the order they were taken, so the
            // next one to post is always free.
            let mut at = 0usize;
            let mut post = |n: usize| {
                for _ in 0..n {
                    let i = at % 16;
                    at += 1;
                    // SAFETY: bufs outlive every completion read below.
                    unsafe { side.srq.post(&mut bufs[i], i).unwrap() };
                }
            };
            post(10);
            assert_eq!(side.srq.read_event().unwrap_err().kind(), ErrorKind::Again);
            w.barrier(); // round 1: 8 messages (10 -> 2 posted)
            for _ in 0..8 {
                next(&w.dom, &side.cq).unwrap();
            }
            let ev = side.srq.wait_event(Some(Duration::from_secs(5))).unwrap();
            // Raised by the dequeue that left 3 posted.
            assert_eq!(ev, SrqEvent::LowWatermark { posted: 3, low_watermark: 4 });
            assert_eq!(
                side.srq.wait_event(Some(Duration::from_millis(50))).unwrap_err().kind(),
                ErrorKind::Again,
                "one event per arming"
            );
            assert!(!side.srq.query().unwrap().armed);
            // Round 2, not re-armed: no event.
            post(8); // 10 posted
            w.barrier();
            for _ in 0..8 {
                next(&w.dom, &side.cq).unwrap();
            }
            assert_eq!(side.srq.read_event().unwrap_err().kind(), ErrorKind::Again, "not re-armed");
            // Re-armed while above the mark: exactly one event again.
            post(8);
            side.srq.set_low_watermark(5).unwrap();
            assert!(side.srq.query().unwrap().armed);
            w.barrier();
            for _ in 0..8 {
                next(&w.dom, &side.cq).unwrap();
            }
            assert_eq!(side.srq.read_event().unwrap(), SrqEvent::LowWatermark { posted: 4, low_watermark: 5 });
            assert_eq!(side.srq.read_event().unwrap_err().kind(), ErrorKind::Again);
            assert_eq!(side.srq.set_low_watermark(17).unwrap_err().kind(), ErrorKind::Inval);
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            for _round in 0..3 {
                w.barrier();
                for i in 0..8 {
                    w.retry(|| w.ep.inject(&header(1, i % 2, i as u64), eps[i % 2]));
                }
            }
            w.barrier();
        }
    });
}

#[test]
fn resize_under_load() {
    run("resize_under_load", 3, &[("SHMFAB_MAX_EPS", "8")], Duration::from_secs(120), |w| {
        const N: u64 = 20_000;
        const SLOTS: usize = 512;
        if w.rank == 0 {
            let side = srq_side(&w, 2, SrqAttr { max_recv: 32, low_watermark: 0 });
            for r in 1..3 {
                w.tell(r, &side.addrs());
            }
            let mut bufs = vec![vec![0u8; 2048]; SLOTS];
            let mut free: Vec<usize> = (0..SLOTS).rev().collect();
            let mut want = [[0u64; 2]; 3];
            let mut got = 0;
            let mut max = 32usize;
            let (mut grows, mut shrinks, mut refused) = (0, 0, 0);
            // A resize waiting for the posted count to fall to it.
            let mut goal: Option<usize> = None;
            while got < 2 * N {
                if let Some(t) = goal {
                    let posted = side.srq.query().unwrap().posted;
                    if t >= posted {
                        side.srq.resize(t).unwrap();
                        if t > max {
                            grows += 1;
                        } else {
                            shrinks += 1;
                        }
                        max = t;
                        goal = None;
                        let info = side.srq.query().unwrap();
                        assert_eq!(info.max_recv, max);
                        assert!(info.posted <= max);
                    } else if refused < 3 {
                        // Below the posted count: refused, nothing dropped.
                        assert_eq!(side.srq.resize(t).unwrap_err().kind(), ErrorKind::Busy);
                        assert_eq!(side.srq.query().unwrap().max_recv, max);
                        refused += 1;
                    }
                }
                // Post what the current maximum allows (nothing while a
                // shrink waits).
                while goal.is_none() {
                    let Some(&i) = free.last() else { break };
                    // SAFETY: bufs outlive every completion read below.
                    match unsafe { side.srq.post(&mut bufs[i], i) } {
                        Ok(()) => {
                            free.pop();
                        }
                        Err(e) if e.kind() == ErrorKind::Again => break,
                        Err(e) => panic!("post: {e}"),
                    }
                }
                let (e, _) = next(&w.dom, &side.cq).unwrap();
                let i = e.op_context;
                let (s, ep, seq) = parse(&bufs[i]);
                assert_eq!(seq, want[s][ep], "order {s}->{ep}");
                assert!(bufs[i][..e.len] == message(s, ep, seq, e.len)[..]);
                want[s][ep] += 1;
                free.push(i);
                got += 1;
                // Every 500 messages: grow or shrink, between 8 and 512.
                if got % 500 == 0 && goal.is_none() {
                    goal = Some([8, 512, 64, 16, 256][(got / 500) as usize % 5]);
                }
            }
            assert!(grows > 0 && shrinks > 0, "grows {grows} shrinks {shrinks} refused {refused}");
            assert_eq!(want[1], [N / 2, N / 2]);
            assert_eq!(want[2], [N / 2, N / 2]);
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            stream(&w, N, 256, |seq| {
                let k = (seq % 2) as usize;
                (message(w.rank, k, seq / 2, 16 + (seq % 2000) as usize), eps[k])
            });
            w.barrier();
        }
    });
}

#[test]
fn endpoint_close_flushes_dequeued_buffers() {
    // CMA off: a large message arrives through the pool, so its receive
    // stays dequeued and incomplete while we stop driving progress.
    let env = [("SHMFAB_CMA", "off"), ("SHMFAB_MAX_EPS", "8"), ("SHMFAB_PEER_CHECK_MS", "20")];
    run("endpoint_close_flushes_dequeued_buffers", 2, &env, Duration::from_secs(60), |w| {
        const BIG: usize = 32 << 20;
        if w.rank == 0 {
            let side = srq_side(&w, 2, SrqAttr { max_recv: 8, low_watermark: 0 });
            w.tell(1, &side.addrs());
            let mut bufs = vec![vec![0u8; BIG]; 5];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive every completion read below.
                unsafe { side.srq.post(b, 100 + i).unwrap() };
            }
            w.barrier();
            // The sender sent 3 big messages to endpoint 0: wait until all
            // three took a buffer (the data cannot all be there yet: the
            // pool holds 2 MiB).
            let t0 = Instant::now();
            while side.srq.query().unwrap().posted > 2 {
                assert!(t0.elapsed() < Duration::from_secs(20), "messages never matched");
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut side = side;
            let ep0 = side.eps.remove(0);
            ep0.close().unwrap();
            // Exactly three flushes, in send order, for cookies 100..103.
            for k in 0..3 {
                let e = next(&w.dom, &side.cq).unwrap_err();
                assert_eq!(e.op_context, 100 + k);
                assert_eq!(e.err, ErrorKind::Canceled.errno());
                assert_eq!(side.cq.strerror(e.prov_errno), "endpoint closed before the receive completed: flushed");
            }
            assert!(stays_empty(&w.dom, &side.cq, 100), "a flushed buffer completed twice");
            // The other endpoint still takes the remaining buffers.
            w.barrier();
            let (e, _) = next(&w.dom, &side.cq).unwrap();
            assert_eq!((e.op_context, e.len), (103, 16));
            assert_eq!(parse(&bufs[3]), (1, 1, 7));
            assert_eq!(side.srq.query().unwrap().endpoints, 1);
            drop(ep0);
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            let big: Vec<Vec<u8>> = (0..3).map(|k| message(1, 0, k, BIG)).collect();
            w.barrier();
            for (k, b) in big.iter().enumerate() {
                send_retry(&w, &w.ep, b, eps[0], k);
            }
            // Each big send fails once the receiving endpoint closed.
            for k in 0..3 {
                let e = w.wait_ctx(k).unwrap_err();
                assert_eq!(e.err, ErrorKind::Io.errno(), "send {k}");
            }
            w.barrier();
            w.retry(|| w.ep.inject(&header(1, 1, 7), eps[1]));
            w.barrier();
        }
    });
}

/// `close_discard` (fi_close's rule: outstanding operations are dropped
/// silently) puts the SRQ buffers the endpoint dequeued but did not fill
/// back at the front of the SRQ: no completion for them, the SRQ counts
/// them posted again, and the next message (to the other endpoint) takes
/// the oldest of them.
#[test]
fn endpoint_close_discard_gives_dequeued_buffers_back() {
    let env = [("SHMFAB_CMA", "off"), ("SHMFAB_MAX_EPS", "8"), ("SHMFAB_PEER_CHECK_MS", "20")];
    run("endpoint_close_discard_gives_dequeued_buffers_back", 2, &env, Duration::from_secs(60), |w| {
        const BIG: usize = 32 << 20;
        if w.rank == 0 {
            let side = srq_side(&w, 2, SrqAttr { max_recv: 8, low_watermark: 0 });
            w.tell(1, &side.addrs());
            let mut bufs = vec![vec![0u8; BIG]; 5];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive every completion read below.
                unsafe { side.srq.post(b, 100 + i).unwrap() };
            }
            w.barrier();
            let t0 = Instant::now();
            while side.srq.query().unwrap().posted > 2 {
                assert!(t0.elapsed() < Duration::from_secs(20), "messages never matched");
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut side = side;
            let ep0 = side.eps.remove(0);
            ep0.close_discard().unwrap();
            assert!(stays_empty(&w.dom, &side.cq, 100), "a given-back buffer completed");
            let q = side.srq.query().unwrap();
            assert_eq!((q.posted, q.endpoints), (5, 1), "the three dequeued buffers are posted again");
            w.barrier();
            // The oldest buffer given back takes the next message.
            let (e, _) = next(&w.dom, &side.cq).unwrap();
            assert_eq!((e.op_context, e.len), (100, 16));
            assert_eq!(parse(&bufs[0][..16]), (1, 1, 7));
            assert_eq!(side.srq.query().unwrap().posted, 4);
            assert!(stays_empty(&w.dom, &side.cq, 50));
            drop(ep0);
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            let big: Vec<Vec<u8>> = (0..3).map(|k| message(1, 0, k, BIG)).collect();
            w.barrier();
            for (k, b) in big.iter().enumerate() {
                send_retry(&w, &w.ep, b, eps[0], k);
            }
            for k in 0..3 {
                let e = w.wait_ctx(k).unwrap_err();
                assert_eq!(e.err, ErrorKind::Io.errno(), "send {k}");
            }
            w.barrier();
            w.retry(|| w.ep.inject(&header(1, 1, 7), eps[1]));
            w.barrier();
        }
    });
}

#[test]
fn empty_srq_gives_back_pressure_then_everything() {
    let env = [("SHMFAB_UNEXP_MAX", "65536")];
    run("empty_srq_gives_back_pressure_then_everything", 2, &env, Duration::from_secs(120), |w| {
        const N: u64 = 20_000;
        const LEN: usize = 1024;
        if w.rank == 0 {
            let side = srq_side(&w, 1, SrqAttr { max_recv: 64, low_watermark: 0 });
            w.tell(1, &side.addrs());
            // Drive progress with nothing posted until the sender is
            // refused; it says so through a file in the job directory.
            let flag = std::path::PathBuf::from(std::env::var("SHMFAB_TEST_DIR").unwrap()).join("refused");
            let t0 = Instant::now();
            while !flag.exists() {
                w.dom.progress().unwrap();
                std::thread::sleep(Duration::from_micros(200));
                assert!(t0.elapsed() < Duration::from_secs(30), "sender never saw back-pressure");
            }
            assert!(side.eps[0].stats().unwrap().stalls > 0, "the receiver stalled its ring");
            let mut bufs = vec![vec![0u8; LEN]; 64];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive every completion read below.
                unsafe { side.srq.post(b, i).unwrap() };
            }
            for want in 0..N {
                let (e, _) = next(&w.dom, &side.cq).unwrap();
                let i = e.op_context;
                assert_eq!(parse(&bufs[i]).2, want);
                assert!(bufs[i] == message(1, 0, want, LEN));
                // SAFETY: as above.
                unsafe { side.srq.post(&mut bufs[i], i).unwrap() };
            }
            w.barrier();
        } else {
            let dest = w.learn(0, 1)[0];
            let flag = std::path::PathBuf::from(std::env::var("SHMFAB_TEST_DIR").unwrap()).join("refused");
            let mut refused = 0;
            for seq in 0..N {
                let m = message(1, 0, seq, LEN);
                loop {
                    match w.ep.inject(&m, dest) {
                        Ok(()) => break,
                        Err(e) if e.kind() == ErrorKind::Again => {
                            if refused == 0 {
                                std::fs::write(&flag, b"1").unwrap();
                            }
                            refused += 1;
                            w.dom.progress().unwrap();
                            w.dom.wait(Some(Duration::from_millis(1)));
                        }
                        Err(e) => panic!("inject: {e}"),
                    }
                }
            }
            assert!(refused > 0, "no back-pressure seen");
            w.barrier();
        }
    });
}

/// Objects, in one process: bind and close rules, refused posts.
#[test]
fn srq_object_rules() {
    std::env::set_var("SHMFAB_JOB_ID", format!("srq-rules-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain().unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    assert_eq!(dom.srq_open(&SrqAttr { max_recv: 0, low_watermark: 0 }).err().unwrap().kind(), ErrorKind::Inval);
    assert_eq!(dom.srq_open(&SrqAttr { max_recv: 4, low_watermark: 5 }).err().unwrap().kind(), ErrorKind::Inval);
    let srq = dom.srq_open(&SrqAttr { max_recv: 2, low_watermark: 1 }).unwrap();
    let ep = dom.endpoint().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_srq(&srq).unwrap();
    assert_eq!(ep.bind_srq(&srq).unwrap_err().kind(), ErrorKind::Inval, "bound twice");
    ep.enable().unwrap();
    let me = av.insert(&[ep.getname()]).unwrap()[0];
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    let mut c = [0u8; 8];
    // SAFETY (all posts below): the buffers outlive the completions read
    // before the end of the test, or are never filled.
    unsafe {
        assert_eq!(ep.recv(&mut a, FI_ADDR_UNSPEC, 1).unwrap_err().kind(), ErrorKind::Inval, "recv on an SRQ ep");
        assert_eq!(srq.post_recv(&mut [], 1).unwrap_err().kind(), ErrorKind::Inval);
        let mut many: Vec<IoSliceMut> = (0..17).map(|_| IoSliceMut::new(&mut [])).collect();
        assert_eq!(srq.post_recv(&mut many, 1).unwrap_err().kind(), ErrorKind::Inval);
        srq.post(&mut a, 1).unwrap();
        srq.post(&mut b, 2).unwrap();
        assert_eq!(srq.post(&mut c, 3).unwrap_err().kind(), ErrorKind::Again, "full");
    }
    assert_eq!(srq.resize(1).unwrap_err().kind(), ErrorKind::Busy, "2 posted");
    srq.resize(3).unwrap();
    // SAFETY: as above.
    unsafe { srq.post(&mut c, 3).unwrap() };
    assert_eq!(srq.query().unwrap(), SrqInfo { posted: 3, max_recv: 3, low_watermark: 1, armed: true, endpoints: 1 });
    // A loopback message takes the oldest buffer.
    ep.inject(b"loopback", me).unwrap();
    let (e, src) = next(&dom, &cq).unwrap();
    assert_eq!((e.op_context, e.len, src), (1, 8, me));
    assert_eq!(&a, b"loopback");
    // Tagged receives stay the endpoint's own.
    let mut t = [0u8; 4];
    // SAFETY: t outlives the completion read below.
    unsafe { ep.trecv(&mut t, FI_ADDR_UNSPEC, 9, 0, 77).unwrap() };
    ep.tinject(b"tag!", me, 9).unwrap();
    assert_eq!(next(&dom, &cq).unwrap().0.op_context, 77);
    // fi_cancel: a posted buffer completes as FI_ECANCELED in the bound
    // endpoint's CQ, once; an unknown cookie cancels nothing.
    assert_eq!(srq.query().unwrap().posted, 2);
    assert!(srq.cancel(3).unwrap());
    assert!(!srq.cancel(3).unwrap(), "cancelled once");
    assert!(!srq.cancel(99).unwrap());
    let x = next(&dom, &cq).unwrap_err();
    assert_eq!((x.op_context, x.err), (3, ErrorKind::Canceled.errno()));
    assert!(stays_empty(&dom, &cq, 10));
    assert_eq!(srq.query().unwrap().posted, 1);
    ep.inject(b"after", me).unwrap();
    let (e, _) = next(&dom, &cq).unwrap();
    assert_eq!((e.op_context, e.len), (2, 5), "the buffer left takes the next message");
    // SAFETY: c outlives the endpoint (its buffer is never filled).
    unsafe { srq.post(&mut c, 4).unwrap() };
    assert_eq!(srq.close().unwrap_err().kind(), ErrorKind::Busy, "endpoint bound");
    ep.close().unwrap();
    assert!(!srq.cancel(4).unwrap(), "no endpoint bound: nowhere to report");
    assert!(stays_empty(&dom, &cq, 10), "posted buffers are not flushed by an endpoint");
    srq.close().unwrap();
    // SAFETY: the post is refused.
    assert_eq!(unsafe { srq.post(&mut c, 4) }.unwrap_err().kind(), ErrorKind::Inval, "closed");
    let other = Fabric::open().unwrap().domain().unwrap();
    let srq2 = other.srq_open(&SrqAttr::default()).unwrap();
    let ep2 = dom.endpoint().unwrap();
    assert_eq!(ep2.bind_srq(&srq2).unwrap_err().kind(), ErrorKind::Inval, "other domain");
}

/// Solicited wait decides whether a receive completion signals the
/// completion channel (across processes).
#[test]
fn solicited_wait_decides_the_signal() {
    run("solicited_wait_decides_the_signal", 2, &[("SHMFAB_MAX_EPS", "8")], Duration::from_secs(60), |w| {
        if w.rank == 0 {
            let side = srq_side(&w, 2, SrqAttr { max_recv: 16, low_watermark: 0 });
            side.eps[1].set_solicited_wait(true).unwrap();
            let ch = w.dom.channel_open().unwrap();
            side.cq.attach_channel(&ch, 0x5A).unwrap();
            w.tell(1, &side.addrs());
            let mut bufs = vec![[0u8; 16]; 16];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive the completions read below.
                unsafe { side.srq.post(b, i).unwrap() };
            }
            let mut events = 0;
            // Step k: the sender sends message k; we arm "next" first.
            // 0: unsolicited to ep0 (normal) -> event
            // 1: unsolicited to ep1 (solicited wait) -> no event
            // 2: solicited to ep1 -> event
            for (k, fires) in [(0, true), (1, false), (2, true)] {
                side.cq.req_notify(false).unwrap();
                w.barrier();
                let (e, _) = next(&w.dom, &side.cq).unwrap();
                assert_eq!(parse(&bufs[e.op_context]).2, k);
                match ch.get_event(Some(Duration::from_millis(if fires { 5000 } else { 100 }))) {
                    Ok(c) => {
                        assert!(fires, "step {k}: unsolicited completion on a solicited-wait endpoint signalled");
                        assert_eq!(c, 0x5A);
                        events += 1;
                    }
                    Err(e) => {
                        assert_eq!(e.kind(), ErrorKind::Again);
                        assert!(!fires, "step {k}: no event");
                    }
                }
            }
            ch.ack(events).unwrap();
            side.cq.detach_channel().unwrap();
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            for (k, ep, flags) in [(0u64, 0usize, 0u64), (1, 1, 0), (2, 1, SHMFAB_SOLICITED)] {
                w.barrier();
                let h = header(1, ep, k);
                let iov = [IoSlice::new(&h)];
                // SAFETY: h lives until the completion read below.
                unsafe {
                    w.ep.sendmsg(&SendMsg { iov: &iov, dest: eps[ep], context: 5, data: 0, tag: 0 }, flags).unwrap()
                };
                w.ok(5);
            }
            w.barrier();
        }
    });
}

/// The receiver's side for the tagged, directed and multi-receive tests:
/// endpoints bound to one SRQ for `flags`, each with its own receive CQ
/// (a completion goes to the CQ of the endpoint that received the
/// message), and each with the AV given (the World's when None).
struct TagSide {
    // Field order is drop order: endpoints before what they are bound to.
    eps: Vec<Endpoint>,
    srq: SharedRecvQueue,
    cqs: Vec<CompletionQueue>,
}

fn tag_side(w: &World, avs: &[&AddressVector], flags: u64, max_recv: usize) -> TagSide {
    let srq = w.dom.srq_open(&SrqAttr { max_recv, low_watermark: 0 }).unwrap();
    let mut eps = Vec::new();
    let mut cqs = Vec::new();
    for av in avs {
        let cq = w.dom.cq_open(&CqAttr { size: 4096, ..Default::default() }).unwrap();
        let ep = w.dom.endpoint().unwrap();
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(av).unwrap();
        ep.bind_srq_for(&srq, flags).unwrap();
        ep.enable().unwrap();
        eps.push(ep);
        cqs.push(cq);
    }
    TagSide { eps, srq, cqs }
}

impl TagSide {
    fn addrs(&self) -> Vec<Address> {
        self.eps.iter().map(|e| e.getname()).collect()
    }
}

/// The next completion at any of `cqs`, with the index of its CQ.
#[allow(clippy::type_complexity)]
fn either(dom: &Domain, cqs: &[CompletionQueue]) -> (usize, std::result::Result<(CqTaggedEntry, FiAddr), CqErrEntry>) {
    let t0 = Instant::now();
    loop {
        for (i, cq) in cqs.iter().enumerate() {
            let mut e = [CqTaggedEntry::default()];
            let mut src = [0u64];
            match cq.readfrom(&mut e, &mut src) {
                Ok(_) => return (i, Ok((e[0], src[0]))),
                Err(x) if x.kind() == ErrorKind::Avail => return (i, Err(cq.readerr().unwrap())),
                Err(x) if x.kind() == ErrorKind::Again => {}
                Err(x) => panic!("cq read: {x}"),
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no completion");
        dom.wait(Some(Duration::from_millis(1)));
    }
}

/// Tag of message `seq` from sender `s` to endpoint `k`.
fn tag_of(s: usize, k: usize, seq: u64) -> u64 {
    ((s as u64) << 40) | ((k as u64) << 32) | seq
}

/// Tagged receives on an SRQ shared by two endpoints, from two sender
/// processes: every message arrives first (unexpected, at the endpoint it
/// was sent to; a peek on the SRQ for the last tag of each connection
/// proves it), then receives posted on the SRQ with ignore masks (any
/// endpoint, any sequence number) take them, each connection's in send
/// order, each completing at the CQ of the endpoint that received it with
/// its tag and source. Then receives posted first take messages arriving
/// later, the first posted receive that accepts a tag taking it.
#[test]
fn tagged_srq_across_two_endpoints_from_two_senders() {
    const N: u64 = 40; // per connection
    run(
        "tagged_srq_across_two_endpoints_from_two_senders",
        3,
        &[("SHMFAB_MAX_EPS", "8")],
        Duration::from_secs(120),
        |w| {
            if w.rank == 0 {
                let side = tag_side(&w, &[&w.av, &w.av], FI_MSG | FI_TAGGED, 512);
                for r in 1..3 {
                    w.tell(r, &side.addrs());
                }
                w.barrier(); // the senders sent everything
                             // A peek for the last message of each connection: found, at
                             // the CQ of its endpoint, with its length, tag and source.
                for s in 1..3 {
                    for k in 0..2 {
                        let t0 = Instant::now();
                        loop {
                            let tag = tag_of(s, k, N - 1);
                            let m = &mut RecvMsg { iov: &mut [], src: FI_ADDR_UNSPEC, context: 900, tag, ignore: 0 };
                            // SAFETY: a peek takes no buffer.
                            unsafe { side.srq.trecvmsg(m, FI_PEEK).unwrap() };
                            match either(&w.dom, &side.cqs) {
                                (0, Err(e)) if e.err == ErrorKind::NoMsg.errno() => {
                                    assert_eq!(e.op_context, 900);
                                    assert!(t0.elapsed() < Duration::from_secs(30), "message {s}->{k} never arrived");
                                }
                                (at, Ok((e, src))) => {
                                    assert_eq!(at, k, "the peek's entry goes to the CQ of the message's endpoint");
                                    assert_eq!((e.op_context, e.len, e.tag, src), (900, 24, tag, w.addrs[s]));
                                    break;
                                }
                                r => panic!("peek: {r:?}"),
                            }
                        }
                    }
                }
                // Everything is unexpected: receives for sender s, any endpoint.
                let mut bufs = vec![[0u8; 24]; (4 * N) as usize];
                for (i, b) in bufs.iter_mut().enumerate() {
                    let s = 1 + i % 2;
                    // SAFETY: bufs outlive every completion read below.
                    unsafe { side.srq.trecv(b, FI_ADDR_UNSPEC, tag_of(s, 0, 0), (1 << 40) - 1, i).unwrap() };
                }
                let mut want = [[0u64; 2]; 3];
                for (k, cq) in side.cqs.iter().enumerate() {
                    for _ in 0..2 * N {
                        let (e, src) = next(&w.dom, cq).unwrap();
                        assert_eq!(e.flags & (FI_RECV | FI_TAGGED), FI_RECV | FI_TAGGED);
                        let (s, ep, seq) = parse(&bufs[e.op_context]);
                        assert_eq!((ep, src, e.tag), (k, w.addrs[s], tag_of(s, k, seq)));
                        assert_eq!(
                            e.op_context % 2,
                            s - 1,
                            "a receive for sender {} took sender {s}'s message",
                            1 + e.op_context % 2
                        );
                        assert_eq!(seq, want[s][k], "connection {s}->{k} out of order");
                        want[s][k] += 1;
                    }
                }
                assert_eq!(side.srq.query().unwrap().posted, 0);
                // Posted first: exact tags, for sequence numbers N.. in
                // reverse order, then a catch-all; each message takes the
                // first posted receive that accepts it.
                let mut late = [[0u8; 24]; 8];
                for (i, b) in late.iter_mut().enumerate().take(4) {
                    let (s, k) = (1 + i / 2, i % 2);
                    // SAFETY: late outlives the completions read below.
                    unsafe { side.srq.trecv(b, FI_ADDR_UNSPEC, tag_of(s, k, N + 1), 0, 1000 + i).unwrap() };
                }
                for (i, b) in late.iter_mut().enumerate().skip(4) {
                    // SAFETY: as above.
                    unsafe { side.srq.trecv(b, FI_ADDR_UNSPEC, 0, u64::MAX, 1000 + i).unwrap() };
                }
                w.barrier(); // the senders send N, then N + 1, to each endpoint
                let mut got = Vec::new();
                for k in 0..2 {
                    for _ in 0..4 {
                        let (e, _) = next(&w.dom, &side.cqs[k]).unwrap();
                        let (s, ep, seq) = parse(&late[e.op_context - 1000]);
                        assert_eq!(ep, k);
                        got.push((e.op_context - 1000, s, k, seq));
                    }
                }
                got.sort();
                // The exact receives took N + 1; the catch-alls took N, in
                // posting order per connection's arrival.
                for (i, &(ctx, s, k, seq)) in got.iter().enumerate().take(4) {
                    assert_eq!((ctx, s, k, seq), (i, 1 + i / 2, i % 2, N + 1));
                }
                assert!(got[4..].iter().all(|g| g.3 == N), "catch-alls took {got:?}");
                assert!(stays_empty(&w.dom, &side.cqs[0], 20) && stays_empty(&w.dom, &side.cqs[1], 20));
                w.barrier();
            } else {
                let eps = w.learn(0, 2);
                let mut msgs = Vec::new();
                for seq in 0..N {
                    for (k, &to) in eps.iter().enumerate() {
                        msgs.push((header(w.rank, k, seq), to, tag_of(w.rank, k, seq)));
                    }
                }
                for (m, to, tag) in &msgs {
                    let mut b = [0u8; 24];
                    b[..16].copy_from_slice(m);
                    w.retry(|| w.ep.tinject(&b, *to, *tag));
                }
                w.barrier();
                w.barrier();
                for seq in [N, N + 1] {
                    for (k, &to) in eps.iter().enumerate() {
                        let mut b = [0u8; 24];
                        b[..16].copy_from_slice(&header(w.rank, k, seq));
                        w.retry(|| w.ep.tinject(&b, to, tag_of(w.rank, k, seq)));
                    }
                }
                w.barrier();
            }
        },
    );
}

/// Directed receives on an SRQ shared by two endpoints with different
/// AVs: the source is an fi_addr that each endpoint reads in its own AV
/// (the source its completions report). Endpoint 0 has the World's AV
/// (fi_addr r is rank r); endpoint 1 has one holding rank 2 at fi_addr 0
/// and rank 1 at fi_addr 1. A receive directed at fi_addr 2 takes rank 2's
/// message at endpoint 0 only; one directed at fi_addr 0 takes rank 2's
/// at endpoint 1 (at endpoint 0, fi_addr 0 is rank 0, which sends
/// nothing); an undirected one takes the rest. Unexpected messages are
/// taken by a later directed receive only from its source.
#[test]
fn directed_srq_receive_takes_only_its_source() {
    run("directed_srq_receive_takes_only_its_source", 3, &[("SHMFAB_MAX_EPS", "8")], Duration::from_secs(120), |w| {
        if w.rank == 0 {
            let av1 = w.dom.av_open().unwrap();
            let names = vec![w.av.lookup(w.addrs[2]).unwrap(), w.av.lookup(w.addrs[1]).unwrap()];
            assert_eq!(av1.insert(&names).unwrap(), vec![0, 1]);
            let side = tag_side(&w, &[&w.av, &av1], FI_MSG | FI_TAGGED, 16);
            for r in 1..3 {
                w.tell(r, &side.addrs());
            }
            let mut b = [[0u8; 16]; 6];
            let mut first = [0u8; 16];
            // SAFETY (all posts): the buffers outlive every completion read
            // below, and the SRQ's close at the end (cancelled or filled).
            unsafe { side.srq.post(&mut first, 0).unwrap() };
            // Step 1: rank 1 -> endpoint 0 takes the plain one.
            w.barrier();
            let (e, src) = next(&w.dom, &side.cqs[0]).unwrap();
            assert_eq!((e.op_context, src), (0, w.addrs[1]));
            let [b0, b1, b2, b3, b4, b5] = &mut b;
            // SAFETY: as above: the buffers outlive their completions, read below.
            unsafe {
                let m = &mut RecvMsg { iov: &mut [IoSliceMut::new(b0)], src: 2, context: 1, tag: 0, ignore: 0 };
                side.srq.recvmsg(m, 0).unwrap();
                let m = &mut RecvMsg { iov: &mut [IoSliceMut::new(b1)], src: 0, context: 2, tag: 0, ignore: 0 };
                side.srq.recvmsg(m, 0).unwrap();
                side.srq.post(b2, 3).unwrap();
                let m = &mut RecvMsg { iov: &mut [IoSliceMut::new(b3)], src: 7, context: 9, tag: 0, ignore: 0 };
                assert_eq!(side.srq.recvmsg(m, 0).unwrap_err().kind(), ErrorKind::AddrNotAvail, "in no AV");
            }
            // Step 2: rank 1 -> endpoint 0 (fi_addr 1 there): neither
            // directed receive, the plain one (3).
            w.barrier();
            let (e, src) = next(&w.dom, &side.cqs[0]).unwrap();
            assert_eq!((e.op_context, src, parse(b2).0), (3, 1, 1));
            // Step 3: rank 2 -> endpoint 1 (fi_addr 0 there): receive 2.
            w.barrier();
            let (e, src) = next(&w.dom, &side.cqs[1]).unwrap();
            assert_eq!((e.op_context, src, parse(b1).0), (2, 0, 2));
            // Step 4: rank 2 -> endpoint 0 (fi_addr 2 there): receive 1.
            w.barrier();
            let (e, src) = next(&w.dom, &side.cqs[0]).unwrap();
            assert_eq!((e.op_context, src, parse(b0).0), (1, 2, 2));
            // Step 5: rank 1 -> endpoint 1 and rank 2 -> endpoint 0, both
            // unexpected (the peek proves they are there). A receive
            // directed at fi_addr 0 takes neither (rank 1 is fi_addr 1 at
            // endpoint 1; rank 2 is fi_addr 2 at endpoint 0); one directed
            // at fi_addr 1 takes rank 1's, a tagged receive nothing.
            w.barrier();
            for (k, s) in [(1, 1), (0, 2)] {
                let t0 = Instant::now();
                loop {
                    // (A peek sees only tagged messages: count what the
                    // endpoint took from its rings instead.)
                    w.dom.progress().unwrap();
                    if side.eps[k].stats().unwrap().rx_ring > if k == 1 { 1 } else { 3 } {
                        break;
                    }
                    assert!(t0.elapsed() < Duration::from_secs(30), "rank {s}'s message never arrived");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            // SAFETY: as above: the buffers outlive their completions, read below.
            unsafe {
                let m = &mut RecvMsg { iov: &mut [IoSliceMut::new(b3)], src: 0, context: 4, tag: 0, ignore: 0 };
                side.srq.recvmsg(m, 0).unwrap();
                side.srq.trecv(b5, FI_ADDR_UNSPEC, 0, u64::MAX, 6).unwrap();
            }
            assert!(stays_empty(&w.dom, &side.cqs[0], 30) && stays_empty(&w.dom, &side.cqs[1], 30));
            // SAFETY: as above: the buffers outlive their completions, read below.
            unsafe {
                let m = &mut RecvMsg { iov: &mut [IoSliceMut::new(b4)], src: 1, context: 5, tag: 0, ignore: 0 };
                side.srq.recvmsg(m, 0).unwrap();
            }
            let (e, src) = next(&w.dom, &side.cqs[1]).unwrap();
            assert_eq!((e.op_context, src, parse(b4).0), (5, 1, 1));
            // Rank 2's message still waits at endpoint 0: an undirected
            // buffer posted now takes it.
            // SAFETY: as above: the buffers outlive their completions, read below.
            unsafe { side.srq.post(b2, 7).unwrap() };
            let (e, src) = next(&w.dom, &side.cqs[0]).unwrap();
            assert_eq!((e.op_context, src, parse(b2).0), (7, 2, 2));
            // Receives 4 (directed at nobody who sends) and 6 (tagged) stay.
            assert_eq!(side.srq.query().unwrap().posted, 2);
            assert!(side.srq.cancel(4).unwrap() && side.srq.cancel(6).unwrap());
            let x = next(&w.dom, &side.cqs[0]).unwrap_err();
            assert_eq!((x.op_context, x.err, x.flags & FI_TAGGED), (4, ErrorKind::Canceled.errno(), 0));
            let x = next(&w.dom, &side.cqs[0]).unwrap_err();
            assert_eq!((x.op_context, x.err, x.flags & FI_TAGGED), (6, ErrorKind::Canceled.errno(), FI_TAGGED));
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            let send = |k: usize, seq: u64| w.retry(|| w.ep.inject(&header(w.rank, k, seq), eps[k]));
            for step in 1..=5 {
                w.barrier();
                match (w.rank, step) {
                    (1, 1) | (1, 2) => send(0, step),
                    (2, 3) => send(1, step),
                    (2, 4) => send(0, step),
                    (1, 5) => send(1, step),
                    (2, 5) => send(0, step),
                    _ => 0,
                };
            }
            w.barrier();
        }
    });
}

/// A multi-receive buffer on an SRQ shared by two endpoints, filled by
/// two senders: each message lands 8-byte aligned after the previous one,
/// whichever endpoint received it; the message that leaves less than
/// FI_OPT_MIN_MULTI_RECV bytes (the last carved) has FI_MULTI_RECV on its
/// completion, the others not; the messages after it wait (unexpected) for the next
/// buffer, which a cancel then releases with FI_MULTI_RECV.
#[test]
fn multi_recv_srq_buffer_fills_and_releases() {
    const PER: usize = 10; // messages per sender, alternating endpoints
    const LEN: usize = 60; // carved as 64 (8-byte alignment)
    run("multi_recv_srq_buffer_fills_and_releases", 3, &[("SHMFAB_MAX_EPS", "8")], Duration::from_secs(120), |w| {
        if w.rank == 0 {
            let side = tag_side(&w, &[&w.av, &w.av], FI_MSG, 8);
            for r in 1..3 {
                w.tell(r, &side.addrs());
            }
            // 1024 bytes, released below 100: 15 messages of 64 (then 64
            // bytes are left).
            side.srq.set_min_multi_recv(100).unwrap();
            let mut big = vec![0u8; 1024];
            let mut next_big = vec![0u8; 1024];
            let (base, base2) = (big.as_ptr() as usize, next_big.as_ptr() as usize);
            // SAFETY (posts): the buffers outlive every completion read below.
            unsafe {
                let m = &mut RecvMsg {
                    iov: &mut [IoSliceMut::new(&mut big)],
                    src: FI_ADDR_UNSPEC,
                    context: 1,
                    tag: 0,
                    ignore: 0,
                };
                assert_eq!(side.srq.recvmsg(m, FI_MULTI_RECV | FI_TAGGED).unwrap_err().kind(), ErrorKind::BadFlags);
                let (a, b) = big.split_at_mut(512);
                let two = &mut [IoSliceMut::new(a), IoSliceMut::new(b)];
                let m = &mut RecvMsg { iov: two, src: FI_ADDR_UNSPEC, context: 1, tag: 0, ignore: 0 };
                assert_eq!(side.srq.recvmsg(m, FI_MULTI_RECV).unwrap_err().kind(), ErrorKind::Inval, "one segment");
                let m = &mut RecvMsg {
                    iov: &mut [IoSliceMut::new(&mut big)],
                    src: FI_ADDR_UNSPEC,
                    context: 1,
                    tag: 0,
                    ignore: 0,
                };
                side.srq.recvmsg(m, FI_MULTI_RECV).unwrap();
            }
            w.barrier(); // the senders sent everything
            let mut offs = Vec::new();
            let mut released = 0;
            for n in 0..15 {
                let (k, r) = either(&w.dom, &side.cqs);
                let (e, src) = r.unwrap();
                assert_eq!((e.op_context, e.len), (1, LEN));
                let off = e.buf - base;
                assert!(off % 8 == 0 && off + LEN <= 1024, "message {n} at {off}");
                let (s, ep, _) = parse(&big[off..off + LEN]);
                assert_eq!((src, ep), (w.addrs[s], k), "completion at the CQ of the endpoint that received it");
                assert!(big[off..off + LEN] == message(s, ep, parse(&big[off..]).2, LEN)[..]);
                if e.flags & FI_MULTI_RECV != 0 {
                    // The 15th message carved (the two CQs are read in
                    // any order, so not necessarily the 15th read).
                    released += 1;
                    assert_eq!(off, 14 * 64, "released by the last message carved");
                }
                offs.push(off);
            }
            assert_eq!(released, 1);
            offs.sort();
            assert_eq!(offs, (0..15).map(|i| i * 64).collect::<Vec<_>>(), "packed, each at the next aligned place");
            assert!(stays_empty(&w.dom, &side.cqs[0], 30) && stays_empty(&w.dom, &side.cqs[1], 30));
            assert_eq!(side.srq.query().unwrap().posted, 0);
            // The next buffer takes the 5 messages that waited.
            // SAFETY: as above: the buffers outlive their completions, read below.
            unsafe {
                let m = &mut RecvMsg {
                    iov: &mut [IoSliceMut::new(&mut next_big)],
                    src: FI_ADDR_UNSPEC,
                    context: 2,
                    tag: 0,
                    ignore: 0,
                };
                side.srq.recvmsg(m, FI_MULTI_RECV).unwrap();
            }
            let mut seen = 0;
            for _ in 0..5 {
                let (_, r) = either(&w.dom, &side.cqs);
                let (e, _) = r.unwrap();
                assert_eq!((e.op_context, e.flags & FI_MULTI_RECV, e.len), (2, 0, LEN));
                assert!(e.buf >= base2 && e.buf + LEN <= base2 + 1024);
                seen += 1;
            }
            assert_eq!(seen, 5);
            assert_eq!(side.srq.query().unwrap().posted, 1, "704 bytes left: still posted");
            assert!(side.srq.cancel(2).unwrap());
            let x = next(&w.dom, &side.cqs[0]).unwrap_err();
            assert_eq!((x.op_context, x.err), (2, ErrorKind::Canceled.errno()));
            assert_eq!(x.flags & FI_MULTI_RECV, FI_MULTI_RECV, "the cancel releases the buffer");
            assert_eq!(side.srq.query().unwrap().posted, 0);
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            for seq in 0..PER {
                let k = seq % 2;
                w.retry(|| w.ep.inject(&message(w.rank, k, seq as u64, LEN), eps[k]));
            }
            w.barrier();
            w.barrier();
        }
    });
}

/// Objects, in one process: refusals, peek/claim/discard and cancel of
/// tagged SRQ receives, and an endpoint closing with SRQ buffers posted.
#[test]
fn srq_tagged_object_rules() {
    std::env::set_var("SHMFAB_JOB_ID", format!("srq-tagged-rules-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain().unwrap();
    let av = dom.av_open().unwrap();
    let srq = dom.srq_open(&SrqAttr { max_recv: 8, low_watermark: 0 }).unwrap();
    let cqs: Vec<CompletionQueue> = (0..3).map(|_| dom.cq_open(&CqAttr::default()).unwrap()).collect();
    let open = |cq: &CompletionQueue, flags: Option<u64>| {
        let ep = dom.endpoint().unwrap();
        ep.bind_cq(cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        if let Some(f) = flags {
            assert_eq!(ep.bind_srq_for(&srq, 0).unwrap_err().kind(), ErrorKind::BadFlags);
            assert_eq!(ep.bind_srq_for(&srq, FI_RMA).unwrap_err().kind(), ErrorKind::BadFlags);
            ep.bind_srq_for(&srq, f).unwrap();
        }
        ep.enable().unwrap();
        ep
    };
    let (e0, e1, tx) = (open(&cqs[0], Some(FI_TAGGED)), open(&cqs[1], Some(FI_MSG | FI_TAGGED)), open(&cqs[2], None));
    let to = av.insert(&[e0.getname(), e1.getname()]).unwrap();
    let mut a = [0u8; 8];
    let mut b = [0u8; 8];
    // SAFETY (all posts below): the buffers outlive the completions read
    // before the end of the test, or are cancelled.
    unsafe {
        assert_eq!(
            e0.trecv(&mut a, FI_ADDR_UNSPEC, 1, 0, 1).unwrap_err().kind(),
            ErrorKind::Inval,
            "tagged: the SRQ's"
        );
        let m = &mut RecvMsg { iov: &mut [], src: FI_ADDR_UNSPEC, context: 1, tag: 1, ignore: 0 };
        assert_eq!(e0.trecvmsg(m, FI_PEEK).unwrap_err().kind(), ErrorKind::Inval, "peeks too");
        // e0 keeps its untagged receives.
        e0.recv(&mut b, FI_ADDR_UNSPEC, 2).unwrap();
        assert_eq!(e1.recv(&mut b, FI_ADDR_UNSPEC, 2).unwrap_err().kind(), ErrorKind::Inval);
        assert_eq!(srq.trecv(&mut a, 99, 1, 0, 1).unwrap_err().kind(), ErrorKind::AddrNotAvail);
        let m =
            &mut RecvMsg { iov: &mut [IoSliceMut::new(&mut a)], src: FI_ADDR_UNSPEC, context: 1, tag: 1, ignore: 0 };
        assert_eq!(srq.trecvmsg(m, FI_MULTI_RECV).unwrap_err().kind(), ErrorKind::BadFlags);
        let m = &mut RecvMsg { iov: &mut [], src: FI_ADDR_UNSPEC, context: 0, tag: 1, ignore: 0 };
        assert_eq!(
            srq.trecvmsg(m, FI_PEEK | FI_CLAIM).unwrap_err().kind(),
            ErrorKind::Inval,
            "a claim needs a context"
        );
        assert_eq!(srq.trecvmsg(m, FI_PEEK | FI_CLAIM | FI_DISCARD).unwrap_err().kind(), ErrorKind::BadFlags);
    }
    tx.inject(b"own", to[0]).unwrap();
    let (e, _) = next(&dom, &cqs[0]).unwrap();
    assert_eq!((e.op_context, &b[..3]), (2, &b"own"[..]), "e0's own untagged receive");
    // Two tagged messages wait at e1, one at e0.
    tx.tinject(b"first", to[1], 0x10).unwrap();
    tx.tinject(b"second", to[1], 0x11).unwrap();
    tx.tinject(b"third", to[0], 0x12).unwrap();
    // Peek | claim the one of tag 0x11 (directed at tx's... any source).
    let peek = |ctx: usize, tag: u64, ignore: u64, flags: u64| {
        let m = &mut RecvMsg { iov: &mut [], src: FI_ADDR_UNSPEC, context: ctx, tag, ignore };
        // SAFETY: a peek takes no buffer.
        unsafe { srq.trecvmsg(m, flags) }
    };
    peek(7, 0x11, 0, FI_PEEK | FI_CLAIM).unwrap();
    let (e, _) = next(&dom, &cqs[1]).unwrap();
    assert_eq!((e.op_context, e.len, e.tag, e.buf), (7, 6, 0x11, 0));
    assert_eq!(peek(7, 0x11, 0, FI_PEEK | FI_CLAIM).unwrap_err().kind(), ErrorKind::Inval, "one claim per context");
    // A claimed message is out of reach of receives and peeks.
    peek(8, 0x11, 0, FI_PEEK).unwrap();
    let x = next(&dom, &cqs[0]).unwrap_err();
    assert_eq!((x.op_context, x.err), (8, ErrorKind::NoMsg.errno()), "ENOMSG at the first tagged endpoint's CQ");
    // SAFETY: a outlives its completion, read below.
    unsafe { srq.trecv(&mut a, FI_ADDR_UNSPEC, 0x10, 0x01, 9).unwrap() };
    let (e, _) = next(&dom, &cqs[1]).unwrap();
    assert_eq!((e.op_context, e.tag, &a[..5]), (9, 0x10, &b"first"[..]), "the free one it accepts (0x11 is claimed)");
    // The claim's receive delivers at e1's CQ.
    let mut c = [0u8; 8];
    unsafe {
        let m =
            &mut RecvMsg { iov: &mut [IoSliceMut::new(&mut c)], src: FI_ADDR_UNSPEC, context: 8, tag: 0, ignore: 0 };
        assert_eq!(srq.trecvmsg(m, FI_CLAIM).unwrap_err().kind(), ErrorKind::Inval, "context 8 holds no claim");
        let m =
            &mut RecvMsg { iov: &mut [IoSliceMut::new(&mut c)], src: FI_ADDR_UNSPEC, context: 7, tag: 0, ignore: 0 };
        srq.trecvmsg(m, FI_CLAIM).unwrap();
    }
    let (e, _) = next(&dom, &cqs[1]).unwrap();
    assert_eq!((e.op_context, e.len, e.tag, &c[..6]), (7, 6, 0x11, &b"second"[..]));
    // Peek | discard the one at e0: gone.
    peek(10, 0x12, 0, FI_PEEK | FI_DISCARD).unwrap();
    let (e, _) = next(&dom, &cqs[0]).unwrap();
    assert_eq!((e.op_context, e.len, e.tag), (10, 5, 0x12));
    peek(11, 0, u64::MAX, FI_PEEK).unwrap();
    assert_eq!(next(&dom, &cqs[0]).unwrap_err().err, ErrorKind::NoMsg.errno(), "nothing left");
    // Cancel: a tagged buffer completes FI_ECANCELED at the first
    // endpoint bound for tagged receives (e0); an untagged one at the
    // first bound for untagged ones (e1).
    // SAFETY: as above: the buffers outlive their completions, read below.
    unsafe {
        srq.trecv(&mut a, FI_ADDR_UNSPEC, 0x20, 0, 12).unwrap();
        srq.post(&mut c, 13).unwrap();
    }
    assert!(srq.cancel(12).unwrap() && srq.cancel(13).unwrap());
    assert!(!srq.cancel(12).unwrap(), "cancelled once");
    let x = next(&dom, &cqs[0]).unwrap_err();
    assert_eq!((x.op_context, x.err, x.flags & FI_TAGGED), (12, ErrorKind::Canceled.errno(), FI_TAGGED));
    let x = next(&dom, &cqs[1]).unwrap_err();
    assert_eq!((x.op_context, x.err, x.flags & FI_TAGGED), (13, ErrorKind::Canceled.errno(), 0));
    // An endpoint closing leaves the SRQ's posted buffers posted (they
    // are the SRQ's, not its own), and the other endpoint takes them.
    // SAFETY: as above: the buffers outlive their completions, read below.
    unsafe { srq.trecv(&mut a, FI_ADDR_UNSPEC, 0x30, 0, 14).unwrap() };
    e1.close().unwrap();
    assert!(stays_empty(&dom, &cqs[1], 10) && stays_empty(&dom, &cqs[0], 10));
    assert_eq!(srq.query().unwrap().posted, 1);
    tx.tinject(b"later", to[0], 0x30).unwrap();
    let (e, _) = next(&dom, &cqs[0]).unwrap();
    assert_eq!((e.op_context, &a[..5]), (14, &b"later"[..]));
    e0.close().unwrap();
    srq.close().unwrap();
}

/// `close_discard` with tagged SRQ buffers dequeued: they go back to the
/// front of the SRQ's tagged queue with their tags (a message of another
/// tag does not take them; the next of theirs takes the oldest).
#[test]
fn endpoint_close_discard_gives_tagged_buffers_back() {
    let env = [("SHMFAB_CMA", "off"), ("SHMFAB_MAX_EPS", "8"), ("SHMFAB_PEER_CHECK_MS", "20")];
    run("endpoint_close_discard_gives_tagged_buffers_back", 2, &env, Duration::from_secs(60), |w| {
        const BIG: usize = 32 << 20;
        if w.rank == 0 {
            let side = tag_side(&w, &[&w.av, &w.av], FI_MSG | FI_TAGGED, 8);
            w.tell(1, &side.addrs());
            let mut bufs = vec![vec![0u8; BIG]; 5];
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlive every completion read below.
                unsafe { side.srq.trecv(b, FI_ADDR_UNSPEC, 5, 0, 100 + i).unwrap() };
            }
            w.barrier();
            let t0 = Instant::now();
            while side.srq.query().unwrap().posted > 2 {
                assert!(t0.elapsed() < Duration::from_secs(20), "messages never matched");
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut side = side;
            let ep0 = side.eps.remove(0);
            let cq0 = side.cqs.remove(0);
            ep0.close_discard().unwrap();
            assert!(stays_empty(&w.dom, &cq0, 50) && stays_empty(&w.dom, &side.cqs[0], 50), "no completion");
            assert_eq!(side.srq.query().unwrap().posted, 5, "the three dequeued buffers are posted again");
            w.barrier(); // tag 6 sent to endpoint 1: no buffer takes it
            assert!(stays_empty(&w.dom, &side.cqs[0], 50));
            w.barrier(); // tag 5: the oldest buffer given back
            let (e, _) = next(&w.dom, &side.cqs[0]).unwrap();
            assert_eq!((e.op_context, e.len, e.tag), (100, 16, 5));
            assert_eq!(parse(&bufs[0][..16]), (1, 1, 8));
            let mut six = [0u8; 16];
            // SAFETY: six outlives the completion read below.
            unsafe { side.srq.trecv(&mut six, FI_ADDR_UNSPEC, 6, 0, 200).unwrap() };
            let (e, _) = next(&w.dom, &side.cqs[0]).unwrap();
            assert_eq!((e.op_context, e.tag, parse(&six)), (200, 6, (1, 1, 7)));
            drop(ep0);
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            let big: Vec<Vec<u8>> = (0..3).map(|k| message(1, 0, k, BIG)).collect();
            w.barrier();
            for (k, b) in big.iter().enumerate() {
                // SAFETY: b outlives the send's completion, waited below.
                w.retry(|| unsafe { w.ep.tsend(b, eps[0], 5, k) });
            }
            for k in 0..3 {
                let e = w.wait_ctx(k).unwrap_err();
                assert_eq!(e.err, ErrorKind::Io.errno(), "send {k}");
            }
            w.barrier();
            w.retry(|| w.ep.tinject(&header(1, 1, 7), eps[1], 6));
            w.barrier();
            w.retry(|| w.ep.tinject(&header(1, 1, 8), eps[1], 5));
            w.barrier();
        }
    });
}

/// Tagged SRQ receives under load, every protocol: two senders stream
/// messages of mixed sizes (inline, through the pool, by rendezvous) with
/// tags to two endpoints sharing one SRQ; the receiver keeps 32 tagged
/// buffers posted (tag: the sender, ignore: the rest), so messages both
/// find buffers and wait unexpected for them. Every message arrives whole,
/// each connection's in send order, at the CQ of its endpoint.
#[test]
fn tagged_srq_mixed_sizes_in_connection_order() {
    const PER: u64 = 3000; // per sender
    const BUFS: usize = 32;
    const BUF: usize = 256 * 1024;
    run("tagged_srq_mixed_sizes_in_connection_order", 3, &[("SHMFAB_MAX_EPS", "8")], Duration::from_secs(240), |w| {
        if w.rank == 0 {
            let side = tag_side(&w, &[&w.av, &w.av], FI_MSG | FI_TAGGED, BUFS);
            for r in 1..3 {
                w.tell(r, &side.addrs());
            }
            let mut bufs = vec![vec![0u8; BUF]; BUFS];
            let post = |srq: &SharedRecvQueue, b: &mut Vec<u8>, i: usize| {
                // Buffers alternate between the senders.
                let s = 1 + i % 2;
                // SAFETY: bufs outlive every completion read below.
                unsafe { srq.trecv(b, FI_ADDR_UNSPEC, tag_of(s, 0, 0), (1 << 40) - 1, i).unwrap() };
            };
            for (i, b) in bufs.iter_mut().enumerate() {
                post(&side.srq, b, i);
            }
            let mut want = [[0u64; 2]; 3];
            for n in 0..2 * PER {
                let (k, r) = either(&w.dom, &side.cqs);
                let (e, src) = r.unwrap_or_else(|e| panic!("error completion {e:?}"));
                let i = e.op_context;
                let (s, ep, seq) = parse(&bufs[i]);
                assert_eq!((ep, src, e.tag), (k, w.addrs[s], tag_of(s, k, seq)), "message {n}");
                assert_eq!(s, 1 + i % 2, "a buffer for sender {} took sender {s}'s message", 1 + i % 2);
                assert_eq!(seq, want[s][k], "connection {s}->{k} out of order");
                want[s][k] += 1;
                assert_eq!(e.len, size_of(seq).max(16));
                assert!(bufs[i][..e.len] == message(s, k, seq, e.len)[..], "payload {s}->{k} #{seq}");
                // Slow down now and then, so that messages wait unexpected.
                if n % 500 == 0 {
                    std::thread::sleep(Duration::from_millis(5));
                }
                post(&side.srq, &mut bufs[i], i);
            }
            assert_eq!(want[1][0] + want[1][1] + want[2][0] + want[2][1], 2 * PER);
            assert!(stays_empty(&w.dom, &side.cqs[0], 30) && stays_empty(&w.dom, &side.cqs[1], 30));
            w.barrier();
        } else {
            let eps = w.learn(0, 2);
            let mut inflight: Vec<Vec<u8>> = Vec::new();
            let mut seqs = [0u64; 2];
            for n in 0..PER {
                let k = (n % 2) as usize;
                let seq = seqs[k];
                seqs[k] += 1;
                inflight.push(message(w.rank, k, seq, size_of(seq)));
                let b = inflight.last().unwrap();
                // SAFETY: the buffer is kept until the window's completions.
                w.retry(|| unsafe { w.ep.tsend(b, eps[k], tag_of(w.rank, k, seq), n as usize) });
                if inflight.len() == 64 {
                    for _ in 0..64 {
                        w.next().unwrap();
                    }
                    inflight.clear();
                }
            }
            for _ in 0..inflight.len() {
                w.next().unwrap();
            }
            w.barrier();
        }
    });
}

/// FI_SELECTIVE_COMPLETION is the receiving endpoint's: an SRQ buffer
/// posted without FI_COMPLETION completes with no entry (its data
/// arrives, its counter counts) at an endpoint whose receive CQ is bound
/// with it, with one at an endpoint bound without; a buffer posted with
/// FI_COMPLETION always writes one.
#[test]
fn srq_selective_completion_is_the_endpoints() {
    std::env::set_var("SHMFAB_JOB_ID", format!("srq-selective-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain().unwrap();
    let av = dom.av_open().unwrap();
    let srq = dom.srq_open(&SrqAttr { max_recv: 8, low_watermark: 0 }).unwrap();
    let cqs: Vec<CompletionQueue> = (0..3).map(|_| dom.cq_open(&CqAttr::default()).unwrap()).collect();
    let cntr = dom.cntr_open().unwrap();
    let eps: Vec<Endpoint> = (0..3)
        .map(|i| {
            let ep = dom.endpoint().unwrap();
            let sel = if i == 0 { FI_SELECTIVE_COMPLETION } else { 0 };
            ep.bind_cq(&cqs[i], FI_TRANSMIT | FI_RECV | sel).unwrap();
            if i == 0 {
                ep.bind_cntr(&cntr, FI_RECV).unwrap();
            }
            ep.bind_av(&av).unwrap();
            if i < 2 {
                ep.bind_srq_for(&srq, FI_MSG | FI_TAGGED).unwrap();
            }
            ep.enable().unwrap();
            ep
        })
        .collect();
    let to = av.insert(&[eps[0].getname(), eps[1].getname()]).unwrap();
    let (mut a, mut b, mut c) = ([0u8; 8], [0u8; 8], [0u8; 8]);
    // SAFETY (posts): the buffers outlive the completions read below.
    unsafe {
        srq.trecv(&mut a, FI_ADDR_UNSPEC, 1, 0, 1).unwrap();
        let m =
            &mut RecvMsg { iov: &mut [IoSliceMut::new(&mut b)], src: FI_ADDR_UNSPEC, context: 2, tag: 1, ignore: 0 };
        srq.trecvmsg(m, FI_COMPLETION).unwrap();
        srq.trecv(&mut c, FI_ADDR_UNSPEC, 1, 0, 3).unwrap();
    }
    eps[2].tinject(b"quiet", to[0], 1).unwrap();
    let t0 = Instant::now();
    while cntr.read().unwrap() < 1 {
        dom.progress().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(10), "the message never arrived");
    }
    assert_eq!(&a[..5], b"quiet");
    assert!(stays_empty(&dom, &cqs[0], 20), "no entry: selective, no FI_COMPLETION");
    eps[2].tinject(b"asked", to[0], 1).unwrap();
    let (e, _) = next(&dom, &cqs[0]).unwrap();
    assert_eq!((e.op_context, &b[..5]), (2, &b"asked"[..]));
    eps[2].tinject(b"other", to[1], 1).unwrap();
    let (e, _) = next(&dom, &cqs[1]).unwrap();
    assert_eq!((e.op_context, &c[..5]), (3, &b"other"[..]), "not selective there");
    assert!(stays_empty(&dom, &cqs[0], 10));
}

/// FI_MULTI_RECV's release is reported by a receive CQ entry (fi_msg(3):
/// "an entry to the associated receive completion queue will always be
/// generated when the buffer has been consumed"), which a counter cannot
/// carry: a multi-receive buffer is refused (`-FI_ENOCQ`) where an
/// endpoint with counters only would take it (an endpoint's own, or an
/// SRQ's with such an endpoint enabled on it), and such an endpoint is not
/// enabled on an SRQ while one is posted there. Plain buffers are fine.
#[test]
fn multi_recv_needs_a_receive_cq() {
    std::env::set_var("SHMFAB_JOB_ID", format!("srq-multi-cntr-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain().unwrap();
    let av = dom.av_open().unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let cntr = dom.cntr_open().unwrap();
    let (srq, srq2) = (dom.srq_open(&SrqAttr::default()).unwrap(), dom.srq_open(&SrqAttr::default()).unwrap());
    // An endpoint with a receive CQ or with counters only.
    let endpoint = |with_cq: bool, srq: Option<&SharedRecvQueue>| {
        let ep = dom.endpoint().unwrap();
        if with_cq {
            ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        } else {
            ep.bind_cntr(&cntr, FI_SEND | FI_RECV).unwrap();
        }
        ep.bind_av(&av).unwrap();
        if let Some(s) = srq {
            ep.bind_srq(s).unwrap();
        }
        ep
    };
    let (mut a, mut b) = (vec![0u8; 256], vec![0u8; 256]);
    // Posts `buf` (context `context`) by `post`.
    fn with(buf: &mut [u8], context: usize, post: impl FnOnce(&mut RecvMsg<'_, '_>) -> Result<()>) -> Result<()> {
        post(&mut RecvMsg { iov: &mut [IoSliceMut::new(buf)], src: FI_ADDR_UNSPEC, context, tag: 0, ignore: 0 })
    }
    let kind = |r: Result<()>| r.unwrap_err().kind();
    // SAFETY (posts): a and b outlive the endpoints and SRQs (dropped
    // first, at the end), and what is posted is cancelled or flushed.
    unsafe {
        // The endpoint's own buffer.
        let own = endpoint(false, None);
        own.enable().unwrap();
        assert_eq!(kind(with(&mut a, 1, |m| own.recvmsg(m, FI_MULTI_RECV))), ErrorKind::NoCq);
        with(&mut a, 1, |m| own.recvmsg(m, 0)).unwrap();
        assert!(own.cancel(1).unwrap());
        // An SRQ with a counter-only endpoint enabled on it.
        let c1 = endpoint(false, Some(&srq));
        c1.enable().unwrap();
        let e = with(&mut a, 2, |m| srq.recvmsg(m, FI_MULTI_RECV)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoCq, "{e}");
        with(&mut a, 2, |m| srq.recvmsg(m, 0)).unwrap();
        assert_eq!(srq.query().unwrap().posted, 1, "the multi-receive buffer was not posted");
        // An SRQ whose enabled endpoints have a receive CQ: posted; a
        // counter-only endpoint bound to it (first) is not enabled while
        // the buffer is there.
        let c2 = endpoint(false, Some(&srq2));
        let q1 = endpoint(true, Some(&srq2));
        q1.enable().unwrap();
        with(&mut b, 3, |m| srq2.recvmsg(m, FI_MULTI_RECV)).unwrap();
        assert_eq!(kind(c2.enable()), ErrorKind::NoCq);
        // Cancelled: its release is reported at q1's CQ (c2, bound first,
        // has none).
        assert!(srq2.cancel(3).unwrap());
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(cq.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
        let err = cq.readerr().unwrap();
        assert_eq!((err.op_context, err.flags & FI_MULTI_RECV), (3, FI_MULTI_RECV));
        c2.enable().unwrap();
        assert_eq!(kind(with(&mut b, 4, |m| srq2.recvmsg(m, FI_MULTI_RECV))), ErrorKind::NoCq);
        // Endpoints bound for the SRQ's untagged receives, none with a
        // receive CQ (a counter-only one, not enabled while the buffer is
        // there): a cancel could not report the release, and says so.
        let srq3 = dom.srq_open(&SrqAttr::default()).unwrap();
        let c3 = endpoint(false, Some(&srq3));
        with(&mut b, 5, |m| srq3.recvmsg(m, FI_MULTI_RECV)).unwrap();
        assert_eq!(kind(c3.enable()), ErrorKind::NoCq);
        assert_eq!(srq3.cancel(5).unwrap_err().kind(), ErrorKind::NoCq);
        assert_eq!(srq3.query().unwrap().posted, 1, "the buffer stays posted");
        // Counters only, bound for the SRQ's tagged receives only: it never
        // takes a multi-receive buffer, so it is enabled.
        let t = dom.endpoint().unwrap();
        t.bind_cntr(&cntr, FI_SEND | FI_RECV).unwrap();
        t.bind_av(&av).unwrap();
        t.bind_srq_for(&srq3, FI_TAGGED).unwrap();
        t.enable().unwrap();
        drop((own, c1, c2, q1, c3, t, srq3));
    }
    drop((srq, srq2));
}
