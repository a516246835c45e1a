//! Triggered operations and the deferred work queue (fi_trigger(3)):
//! firing order (equal thresholds, a counter jumping past several, a
//! threshold already met), cancel and flush, reporting (no CQ entry and no
//! endpoint counter without FI_COMPLETION), every operation type fired
//! (through the target's mailbox too), work fired by a peer's RMA on an
//! FI_RMA_EVENT counter, a chain of 1,000 deferred writes across 4 ranks,
//! chains of deferred work queued as one (`Domain::queue_chain`) and
//! chain templates queued again and again (`Domain::queue_template`), and work
//! that fires with auto progress while the application sleeps; deferred
//! and triggered receives (posted when they fire, a message sent before
//! matched then, their completion counter counted on arrival, ordered
//! with the others, cancelled, flushed, dropped at endpoint close), and a
//! receive posted by a trigger whose arrival fires a send across 2 ranks.

mod common;
use common::{pattern, put_file, run, test_dir, World};
use shmfab::{
    AtomicMsg, AtomicOp, AtomicType, CompletionQueue, Counter, CqAttr, CqTaggedEntry, DeferredOp, DeferredWork,
    Endpoint, ErrorKind, MemoryRegion, RecvMsg, RmaIoc, RmaIov, SendMsg, Trigger, FI_ADDR_UNSPEC, FI_ATOMIC,
    FI_COMPLETION, FI_INJECT, FI_MSG, FI_MULTI_RECV, FI_READ, FI_RECV, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_RMA,
    FI_SEND, FI_TAGGED, FI_TRANSMIT, FI_WRITE,
};
use std::io::{IoSlice, IoSliceMut};
use std::time::{Duration, Instant};

const RW: u64 = FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE;
const T: Duration = Duration::from_secs(120);

/// Publishes this rank's `vals` under `name`; returns rank `from`'s.
fn share(w: &World, name: &str, vals: &[u64], from: usize) -> Vec<u64> {
    put_file(&format!("{}.{name}", w.rank), &vals.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" "));
    let p = test_dir().join(format!("{from}.{name}"));
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(&p) {
            return s.split_whitespace().map(|v| v.parse().unwrap()).collect();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "rank {from} never published {name}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn heap_bytes(mr: &MemoryRegion) -> &[u8] {
    // SAFETY: the heap mapping of the registration, alive with it.
    unsafe { std::slice::from_raw_parts(mr.as_ptr(), mr.len()) }
}

/// The u64 at byte `off` of a heap registration, read as a peer may write
/// it (volatile: no call of ours orders it).
fn heap_u64(mr: &MemoryRegion, off: usize) -> u64 {
    assert!(off + 8 <= mr.len());
    // SAFETY: inside the mapping; 8-byte aligned offsets only.
    unsafe { std::ptr::read_volatile(mr.as_ptr().add(off) as *const u64) }
}

/// Waits (driving progress) until `c` reads `want`.
fn wait_value(w: &World, c: &Counter, want: u64, what: &str) {
    let t0 = Instant::now();
    while c.read().unwrap() != want {
        assert!(t0.elapsed() < Duration::from_secs(60), "{what}: counter at {} not {want}", c.read().unwrap());
        w.dom.wait(Some(Duration::from_millis(1)));
    }
}

/// Every completion `cq` holds now (after a progress pass).
fn drain(cq: &CompletionQueue) -> Vec<CqTaggedEntry> {
    let mut out = Vec::new();
    let mut e = [CqTaggedEntry::default(); 16];
    while let Ok(n) = cq.read(&mut e) {
        out.extend_from_slice(&e[..n]);
    }
    out
}

fn cntr_add<'a>(go: &'a Counter, threshold: u64, out: &'a Counter, value: u64) -> DeferredWork<'a> {
    DeferredWork { threshold, triggering: go, completion: None, op: DeferredOp::CntrAdd { cntr: out, value } }
}

fn cntr_set<'a>(go: &'a Counter, threshold: u64, out: &'a Counter, value: u64) -> DeferredWork<'a> {
    DeferredWork { threshold, triggering: go, completion: None, op: DeferredOp::CntrSet { cntr: out, value } }
}

/// Triggered tagged sends to ourselves, tag = submission index, fire in
/// (threshold, submission) order: equal thresholds in submission order, a
/// jump past several thresholds in threshold order, a threshold already
/// met at once. Deferred counter operations keep the same order.
fn ordering(w: World) {
    let me = w.addrs[0];
    let go = w.dom.cntr_open().unwrap();
    let mut rbuf = [[0u8; 8]; 8];
    for (i, b) in rbuf.iter_mut().enumerate() {
        // SAFETY: the buffers outlive the receives, completed below.
        unsafe { w.ep.trecv(b, FI_ADDR_UNSPEC, 0, u64::MAX, 100 + i).unwrap() };
    }
    let thresholds = [3u64, 1, 3, 2, 1, 5];
    let payload: Vec<[u8; 8]> = (0..8u64).map(|i| i.to_le_bytes()).collect();
    for (i, &t) in thresholds.iter().enumerate() {
        let iov = [IoSlice::new(&payload[i])];
        let m = SendMsg { iov: &iov, dest: me, context: 200 + i, data: 0, tag: i as u64 };
        // SAFETY: `payload` outlives the sends (their completions are read below).
        unsafe { w.ep.triggered(Trigger { cntr: &go, threshold: t }).tsendmsg(m, 0).unwrap() };
    }
    assert_eq!(w.dom.queued_work().unwrap(), 6);
    let recvd = |n: usize| -> Vec<u64> {
        let mut tags = Vec::new();
        let t0 = Instant::now();
        while tags.len() < n {
            for e in drain(&w.cq) {
                if e.flags & FI_RECV != 0 {
                    tags.push(e.tag);
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "got {tags:?}, want {n}");
        }
        std::thread::sleep(Duration::from_millis(20));
        for e in drain(&w.cq) {
            assert_eq!(e.flags & FI_RECV, 0, "an extra receive: {e:?}");
        }
        tags
    };
    assert!(drain(&w.cq).is_empty(), "nothing fires below its threshold");
    go.add(1).unwrap();
    assert_eq!(recvd(2), [1, 4], "threshold 1, in submission order");
    go.add(3).unwrap(); // 1 -> 4: past 2 and 3 at once
    assert_eq!(recvd(3), [3, 0, 2], "threshold 2, then the two of 3 in submission order");
    assert_eq!(w.dom.queued_work().unwrap(), 1);
    go.set(5).unwrap();
    assert_eq!(recvd(1), [5]);
    // Already met: runs at once (the call itself fires it).
    let iov = [IoSlice::new(&payload[6])];
    let m = SendMsg { iov: &iov, dest: me, context: 206, data: 0, tag: 6 };
    // SAFETY: as above.
    unsafe { w.ep.triggered(Trigger { cntr: &go, threshold: 2 }).tsendmsg(m, 0).unwrap() };
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    assert_eq!(recvd(1), [6]);
    for (i, b) in rbuf.iter().take(7).enumerate() {
        let tag = u64::from_le_bytes(*b);
        assert!(tag < 7, "receive {i} got {tag}");
    }

    // Deferred counter operations: equal thresholds in submission order
    // (set 10 then add 1: 11, not 10); a jump past two thresholds in
    // threshold order (add 5 at 1, then set 100 at 2: 100, not 105).
    let (g, out) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    // SAFETY: counter operations name no buffer.
    unsafe {
        w.dom.queue_work(cntr_set(&g, 1, &out, 10)).unwrap();
        w.dom.queue_work(cntr_add(&g, 1, &out, 1)).unwrap();
    }
    g.add(1).unwrap();
    assert_eq!(out.read().unwrap(), 11);
    // SAFETY: as above.
    unsafe {
        w.dom.queue_work(cntr_set(&g, 3, &out, 100)).unwrap();
        w.dom.queue_work(cntr_add(&g, 2, &out, 5)).unwrap();
    }
    g.add(2).unwrap();
    assert_eq!(out.read().unwrap(), 100);
    // The trigger counts errors too (success plus error values).
    // SAFETY: as above.
    unsafe { w.dom.queue_work(cntr_add(&g, 4, &out, 1)).unwrap() };
    g.adderr(1).unwrap();
    assert_eq!(out.read().unwrap(), 101);
}

#[test]
fn ordering_by_threshold_then_submission() {
    run("ordering_by_threshold_then_submission", 1, &[], T, ordering);
}

/// Cancel and flush: cancelled and flushed work never runs; a flush by
/// counter leaves the work on other counters; counters held by work cannot
/// close; requests are checked at submission (objects first, then
/// -FI_ENOSYS for what is not supported).
fn cancel_flush(w: World) {
    let (a, b, out) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    // SAFETY: counter operations name no buffer.
    let ids: Vec<_> = unsafe {
        [cntr_add(&a, 1, &out, 1), cntr_add(&a, 1, &out, 10), cntr_add(&b, 1, &out, 100), cntr_add(&b, 2, &out, 1000)]
            .into_iter()
            .map(|wk| w.dom.queue_work(wk).unwrap())
            .collect()
    };
    // SAFETY: as above.
    let late = unsafe { w.dom.queue_work(cntr_add(&a, 5, &out, 10_000)).unwrap() };
    assert!(w.dom.cancel_work(ids[1]).unwrap());
    assert!(!w.dom.cancel_work(ids[1]).unwrap(), "cancelled twice");
    assert_eq!(w.dom.flush_work(Some(&b)).unwrap(), 2);
    assert_eq!(w.dom.queued_work().unwrap(), 2);
    b.close().unwrap(); // the flush released it
    let b = w.dom.cntr_open().unwrap();
    assert_eq!(a.close().unwrap_err().kind(), ErrorKind::Busy, "work waits on a");
    a.add(1).unwrap();
    b.add(2).unwrap();
    assert_eq!(out.read().unwrap(), 1, "only the first add ran");
    assert!(!w.dom.cancel_work(ids[0]).unwrap(), "work that ran is no longer queued");
    assert_eq!(w.dom.flush_work(None).unwrap(), 1);
    assert!(!w.dom.cancel_work(late).unwrap());
    a.add(10).unwrap();
    w.dom.progress().unwrap();
    assert_eq!(out.read().unwrap(), 1, "flushed work never runs");
    assert_eq!(w.dom.queued_work().unwrap(), 0);

    // Checks at submission.
    let other = w.fabric.domain().unwrap();
    let foreign = other.cntr_open().unwrap();
    // SAFETY: counter operations name no buffer; the receives are refused.
    unsafe {
        let e = w.dom.queue_work(cntr_add(&foreign, 1, &out, 1)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Inval, "{e}");
        let wk = DeferredWork {
            threshold: 1,
            triggering: &a,
            completion: Some(&b),
            op: DeferredOp::CntrAdd { cntr: &out, value: 1 },
        };
        assert_eq!(
            w.dom.queue_work(wk).unwrap_err().kind(),
            ErrorKind::Inval,
            "counter ops take no completion counter"
        );
        let mut buf = [0u8; 8];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 0, tag: 0, ignore: 0 };
        let wk = DeferredWork {
            threshold: 1,
            triggering: &a,
            completion: Some(&b),
            op: DeferredOp::Recv { ep: &w.ep, msg, flags: FI_MULTI_RECV },
        };
        assert_eq!(w.dom.queue_work(wk).unwrap_err().kind(), ErrorKind::NoSys, "no deferred multi-receive");
        let closed = w.dom.endpoint().unwrap();
        closed.close().unwrap();
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 0, tag: 0, ignore: 0 };
        let wk = DeferredWork {
            threshold: 1,
            triggering: &a,
            completion: Some(&b),
            op: DeferredOp::Recv { ep: &closed, msg, flags: 0 },
        };
        assert_eq!(w.dom.queue_work(wk).unwrap_err().kind(), ErrorKind::Inval, "the endpoint is checked first");
        let iov = [IoSlice::new(&buf)];
        let msg = SendMsg { iov: &iov, dest: w.addrs[0], context: 0, data: 0, tag: 0 };
        let wk = DeferredWork {
            threshold: 1,
            triggering: &a,
            completion: Some(&b),
            op: DeferredOp::Send { ep: &w.ep, msg, flags: 1 << 60 },
        };
        assert_eq!(w.dom.queue_work(wk).unwrap_err().kind(), ErrorKind::BadFlags);
    }
    assert_eq!(w.dom.queued_work().unwrap(), 0, "refused work is not queued");
    a.close().unwrap();
}

#[test]
fn cancel_and_flush() {
    run("cancel_and_flush", 1, &[], T, cancel_flush);
}

/// A chain ([`Domain::queue_chain`]): one queue entry; its steps run in
/// order, each once the one before ran and its own counter reached its
/// threshold (a step already met waits for the one before it); it moves
/// from counter to counter (flush by counter finds it where it waits);
/// cancel takes its steps not yet run and frees their counters; a chain
/// due at submission runs before the call returns; a push that fails, or
/// an empty chain, queues nothing.
fn chains(w: World) {
    let (a, b, out, done) = (
        w.dom.cntr_open().unwrap(),
        w.dom.cntr_open().unwrap(),
        w.dom.cntr_open().unwrap(),
        w.dom.cntr_open().unwrap(),
    );
    // SAFETY: counter operations name no buffer.
    let (_, k) = unsafe {
        w.dom
            .queue_chain(|c| {
                c.push(cntr_add(&a, 1, &out, 1))?;
                c.push(cntr_add(&b, 2, &out, 10))?;
                c.push(cntr_add(&a, 1, &out, 100))?;
                c.push(cntr_add(&out, 111, &done, 1))?;
                Ok(c.len())
            })
            .unwrap()
    };
    assert_eq!(k, 4);
    assert_eq!(w.dom.queued_work().unwrap(), 1, "a chain is one queue entry");
    b.add(2).unwrap();
    w.dom.progress().unwrap();
    assert_eq!(out.read().unwrap(), 0, "the second step waits for the first");
    a.add(1).unwrap();
    w.dom.progress().unwrap();
    assert_eq!((out.read().unwrap(), done.read().unwrap()), (111, 1), "every step, in order");
    assert_eq!(w.dom.queued_work().unwrap(), 0);

    // Moved to b's counter, flushed there.
    // SAFETY: as above.
    unsafe {
        w.dom
            .queue_chain(|c| {
                c.push(cntr_add(&a, 2, &out, 1000))?;
                c.push(cntr_add(&b, 3, &out, 1))
            })
            .unwrap()
    };
    assert_eq!(w.dom.flush_work(Some(&b)).unwrap(), 0, "it waits on a");
    a.add(1).unwrap();
    w.dom.progress().unwrap();
    assert_eq!(out.read().unwrap(), 1111);
    assert_eq!(w.dom.flush_work(Some(&a)).unwrap(), 0, "it moved on to b");
    assert_eq!(w.dom.flush_work(Some(&b)).unwrap(), 1);
    b.add(1).unwrap();
    w.dom.progress().unwrap();
    assert_eq!(out.read().unwrap(), 1111, "flushed steps never run");

    // Cancel: the steps' counters are released.
    let c2 = w.dom.cntr_open().unwrap();
    // SAFETY: as above.
    let (id, ()) = unsafe {
        w.dom
            .queue_chain(|c| {
                c.push(cntr_add(&a, 100, &out, 5))?;
                c.push(cntr_add(&c2, 1, &out, 5))
            })
            .unwrap()
    };
    assert_eq!(c2.close().unwrap_err().kind(), ErrorKind::Busy, "a step waits on it");
    assert!(w.dom.cancel_work(id).unwrap());
    assert!(!w.dom.cancel_work(id).unwrap(), "cancelled twice");
    c2.close().unwrap();

    // Due at submission: runs before the call returns.
    // SAFETY: as above.
    unsafe { w.dom.queue_chain(|c| c.push(cntr_add(&a, 0, &out, 7))).unwrap() };
    assert_eq!(out.read().unwrap(), 1118);
    assert_eq!(w.dom.queued_work().unwrap(), 0);

    // A push that fails, an empty chain: nothing queued, nothing bound.
    let other = w.fabric.domain().unwrap();
    let foreign = other.cntr_open().unwrap();
    let c3 = w.dom.cntr_open().unwrap();
    // SAFETY: as above.
    let e = unsafe {
        w.dom.queue_chain(|c| {
            c.push(cntr_add(&c3, 1, &out, 1))?;
            c.push(cntr_add(&foreign, 1, &out, 1))
        })
    };
    assert_eq!(e.unwrap_err().kind(), ErrorKind::Inval);
    // SAFETY: as above.
    let e = unsafe { w.dom.queue_chain(|_| Ok(())) };
    assert_eq!(e.unwrap_err().kind(), ErrorKind::Inval, "an empty chain");
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    c3.close().unwrap();
}

#[test]
fn chained_work() {
    run("chained_work", 1, &[], T, chains);
}

/// A chain template ([`Domain::chain_template`]): each copy queued waits
/// at its own thresholds (moved by the caller), a reduction's destination
/// is replaced per copy (only a reduction's: anything else is refused and
/// nothing queued), and the counters it names stay bound while it lives.
fn templates(w: World) {
    let (a, out) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    let src = [1u8, 2, 3, 4];
    let (mut d0, mut d1, mut d2) = ([0u8; 4], [0u8; 4], [0u8; 4]);
    let t = w
        .dom
        .chain_template(|c| {
            c.push(DeferredWork {
                threshold: 1,
                triggering: &a,
                completion: None,
                op: DeferredOp::Reduce { dt: AtomicType::Uint8, op: AtomicOp::Write, src: &src, dst: &mut d0 },
            })?;
            c.push(cntr_add(&a, 1, &out, 1))
        })
        .unwrap();
    assert_eq!(w.dom.queued_work().unwrap(), 0, "built, not queued");
    assert_eq!(a.close().unwrap_err().kind(), ErrorKind::Busy, "the template holds its counters");
    // SAFETY: d0, d1, d2 and src outlive the copies (read after they ran).
    unsafe { w.dom.queue_template(&t, |_, th| th, &[]).unwrap() };
    assert_eq!(out.read().unwrap(), 0);
    a.add(1).unwrap();
    w.dom.progress().unwrap();
    assert_eq!((out.read().unwrap(), d0), (1, src), "the first copy, as built");
    // SAFETY: as above.
    unsafe { w.dom.queue_template(&t, |_, th| th + 1, &[(0, d1.as_mut_ptr())]).unwrap() };
    w.dom.progress().unwrap();
    assert_eq!((out.read().unwrap(), d1), (1, [0; 4]), "the second copy waits for a = 2");
    a.add(1).unwrap();
    w.dom.progress().unwrap();
    assert_eq!((out.read().unwrap(), d1, d2), (2, src, [0; 4]), "into d1 only");
    // SAFETY: as above.
    let e = unsafe { w.dom.queue_template(&t, |_, th| th + 1, &[(1, d2.as_mut_ptr())]) };
    assert_eq!(e.unwrap_err().kind(), ErrorKind::Inval, "step 1 is a counter add");
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    // Already due: runs before the call returns.
    // SAFETY: as above.
    unsafe { w.dom.queue_template(&t, |_, th| th + 1, &[(0, d2.as_mut_ptr())]).unwrap() };
    assert_eq!((out.read().unwrap(), d2), (3, src));
    // Re-armed in place: a destination not given is the one built (d0),
    // not the last one given.
    d0 = [0; 4];
    d2 = [0; 4];
    // SAFETY: as above.
    unsafe { w.dom.queue_template(&t, |_, th| th + 2, &[]).unwrap() };
    assert_eq!(w.dom.queued_work().unwrap(), 1, "waits for a = 3");
    // The chain is the template's own: not queued twice.
    // SAFETY: as above.
    let e = unsafe { w.dom.queue_template(&t, |_, th| th + 2, &[]) };
    assert_eq!(e.unwrap_err().kind(), ErrorKind::Busy, "still queued");
    assert_eq!(w.dom.flush_work(Some(&a)).unwrap(), 1, "flushed: home again");
    a.add(1).unwrap();
    assert_eq!((out.read().unwrap(), d0), (3, [0; 4]), "the flushed queueing never ran");
    // Many re-arms, each at its own threshold, alternating destinations.
    for k in 0..100u64 {
        let now = a.read().unwrap();
        let d = if k % 2 == 0 { d1.as_mut_ptr() } else { d2.as_mut_ptr() };
        // SAFETY: as above.
        unsafe { w.dom.queue_template(&t, |_, th| th - 1 + now + 1, &[(0, d)]).unwrap() };
        assert_eq!(out.read().unwrap(), 3 + k, "waits for the next add");
        a.add(1).unwrap();
        assert_eq!(out.read().unwrap(), 4 + k, "ran once");
    }
    assert_eq!((d0, d1, d2), ([0; 4], src, src));
    // Cancelled by its id: home again, re-armed at once.
    // SAFETY: as above.
    let id = unsafe { w.dom.queue_template(&t, |_, th| th + 1000, &[]).unwrap() };
    assert!(w.dom.cancel_work(id).unwrap());
    assert!(!w.dom.cancel_work(id).unwrap(), "cancelled once");
    let now = a.read().unwrap();
    // SAFETY: as above.
    unsafe { w.dom.queue_template(&t, |_, th| th - 1 + now, &[]).unwrap() };
    assert_eq!((out.read().unwrap(), d0), (104, src), "due at once: ran inside the call");
    // Dropped while queued: cancelled, its counters released.
    // SAFETY: as above.
    unsafe { w.dom.queue_template(&t, |_, th| th + 1000, &[]).unwrap() };
    assert_eq!(w.dom.queued_work().unwrap(), 1);
    drop(t);
    assert_eq!(w.dom.queued_work().unwrap(), 0, "the template's chain went with it");
    a.close().unwrap();
}

#[test]
fn chain_templates() {
    run("chain_templates", 1, &[], T, templates);
}

/// Deferred sends report only on their completion counter unless they ask
/// with FI_COMPLETION (then their endpoint's CQ and counter too); a
/// triggered send reports as a send; work fires on a counter a local
/// completion moved.
fn reporting(w: World) {
    let me = w.addrs[0];
    let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
    let tx = w.dom.endpoint().unwrap();
    let sent = w.dom.cntr_open().unwrap();
    tx.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    tx.bind_cntr(&sent, FI_SEND).unwrap();
    tx.bind_av(&w.av).unwrap();
    tx.enable().unwrap();
    let (go, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    let data = pattern(100, 1);
    let mut rb = vec![0u8; 100];
    // SAFETY: rb outlives the receive.
    unsafe { w.ep.recv(&mut rb, FI_ADDR_UNSPEC, 1).unwrap() };
    let iov = [IoSlice::new(&data)];
    let msg = SendMsg { iov: &iov, dest: me, context: 11, data: 0, tag: 0 };
    let wk = DeferredWork {
        threshold: 1,
        triggering: &go,
        completion: Some(&done),
        op: DeferredOp::Send { ep: &tx, msg, flags: 0 },
    };
    // SAFETY: data outlives the send (its completion counter is read below).
    unsafe { w.dom.queue_work(wk).unwrap() };
    go.add(1).unwrap();
    w.ok(1);
    assert_eq!(rb, data);
    wait_value(&w, &done, 1, "deferred send");
    assert_eq!(sent.read().unwrap(), 0, "no endpoint counter without FI_COMPLETION");
    assert!(drain(&cq).is_empty(), "no CQ entry without FI_COMPLETION");

    // With FI_COMPLETION: both.
    // SAFETY: as above.
    unsafe { w.ep.recv(&mut rb, FI_ADDR_UNSPEC, 2).unwrap() };
    let msg = SendMsg { iov: &iov, dest: me, context: 12, data: 0, tag: 0 };
    let wk = DeferredWork {
        threshold: 2,
        triggering: &go,
        completion: Some(&done),
        op: DeferredOp::Send { ep: &tx, msg, flags: FI_COMPLETION },
    };
    // SAFETY: as above.
    unsafe { w.dom.queue_work(wk).unwrap() };
    go.add(1).unwrap();
    w.ok(2);
    wait_value(&w, &done, 2, "deferred send with FI_COMPLETION");
    assert_eq!(sent.read().unwrap(), 1);
    let e = drain(&cq);
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].op_context, e[0].flags), (12, FI_SEND | FI_MSG));

    // A triggered send completes as a send (CQ entry, counter), and its
    // trigger is the send counter, moved by the completion just read: the
    // inject below completes in a pass, which then fires the tagged send.
    // SAFETY: as above.
    unsafe { w.ep.trecv(&mut rb, FI_ADDR_UNSPEC, 7, 0, 3).unwrap() };
    let msg = SendMsg { iov: &iov, dest: me, context: 13, data: 0, tag: 7 };
    // SAFETY: as above.
    unsafe { tx.triggered(Trigger { cntr: &sent, threshold: 2 }).tsendmsg(msg, FI_INJECT).unwrap() };
    assert_eq!(w.dom.queued_work().unwrap(), 1);
    let small = [9u8; 8];
    // SAFETY: small outlives the send, completed below.
    unsafe { tx.send(&small, me, 14).unwrap() };
    let mut b8 = [0u8; 8];
    // SAFETY: b8 outlives the receive.
    unsafe { w.ep.recv(&mut b8, FI_ADDR_UNSPEC, 4).unwrap() };
    w.ok(4);
    w.ok(3);
    assert_eq!(rb, data);
    wait_value(&w, &sent, 3, "triggered send's counter");
    let e = drain(&cq);
    assert_eq!(
        e.iter().map(|e| (e.op_context, e.flags)).collect::<Vec<_>>(),
        [(14, FI_SEND | FI_MSG), (13, FI_SEND | FI_TAGGED)]
    );
    assert_eq!(done.read().unwrap(), 2, "a triggered operation has no completion counter");

    // Failures count on the completion counter's error value, and still
    // write nothing to the CQ: a write with a key that names nothing, and
    // a send whose endpoint closed while it waited.
    let bad = [RmaIov { addr: 0, len: 8, key: 0xdead_0000 }];
    let short = [IoSlice::new(&data[..8])];
    let op = DeferredOp::Write { ep: &tx, iov: &short, rma_iov: &bad, dest: me, context: 15, data: 0, flags: 0 };
    let wk = DeferredWork { threshold: 3, triggering: &go, completion: Some(&done), op };
    // SAFETY: as above.
    unsafe { w.dom.queue_work(wk).unwrap() };
    let gone = w.dom.endpoint().unwrap();
    gone.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    gone.bind_av(&w.av).unwrap();
    gone.enable().unwrap();
    let msg = SendMsg { iov: &iov, dest: me, context: 16, data: 0, tag: 0 };
    let wk = DeferredWork {
        threshold: 3,
        triggering: &go,
        completion: Some(&done),
        op: DeferredOp::Send { ep: &gone, msg, flags: 0 },
    };
    // SAFETY: as above.
    unsafe { w.dom.queue_work(wk).unwrap() };
    gone.close().unwrap();
    go.add(1).unwrap();
    assert_eq!((done.read().unwrap(), done.readerr().unwrap()), (2, 2));
    assert!(drain(&cq).is_empty(), "failed deferred work wrote CQ entries");
}

#[test]
fn deferred_work_reports_only_when_asked() {
    run("deferred_work_reports_only_when_asked", 1, &[], T, reporting);
}

/// Rank 0 fires every operation type at rank 1 (heap memory and user
/// memory, so the mailbox path runs inside rank 0's progress pass when
/// single copy is off): as deferred work on a completion counter, then as
/// triggered operations of its endpoint.
fn every_op(w: World) {
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        let mut user = vec![0u64; 512];
        // SAFETY: `user` outlives the registration, closed at the end.
        let mut umr = unsafe { w.dom.mr_reg(user.as_mut_ptr().cast(), 4096, RW).unwrap() };
        // Operands the reads and atomics see.
        let init = |b: &mut [u8]| {
            b[1024..1032].copy_from_slice(&40u64.to_le_bytes());
            b[1032..1040].copy_from_slice(&7u64.to_le_bytes());
            b[2048..2048 + 64].copy_from_slice(&pattern(64, 3));
        };
        // SAFETY: our own heap mapping; no peer writes it yet.
        init(unsafe { std::slice::from_raw_parts_mut(heap.as_ptr(), 4096) });
        // SAFETY: as above, our own buffer.
        init(unsafe { std::slice::from_raw_parts_mut(user.as_mut_ptr().cast::<u8>(), 4096) });
        let mut rx = [[0u8; 32]; 4];
        for (i, b) in rx.iter_mut().enumerate() {
            // SAFETY: rx outlives the receives, completed below. Per pass
            // one send and one tagged send.
            unsafe {
                if i % 2 == 0 {
                    w.ep.recv(b, FI_ADDR_UNSPEC, 50 + i).unwrap()
                } else {
                    w.ep.trecv(b, FI_ADDR_UNSPEC, 0, u64::MAX, 50 + i).unwrap()
                }
            };
        }
        share(&w, "keys", &[heap.key(), umr.key()], 0);
        for i in 0..4 {
            w.ok(50 + i);
        }
        w.barrier();
        let user_b = || {
            // SAFETY: our buffer; the peer is done (barrier).
            unsafe { std::slice::from_raw_parts(user.as_ptr().cast::<u8>(), 4096) }
        };
        for (r, b) in [(0, heap_bytes(&heap)), (1, user_b())] {
            // Two writes per region: deferred (at 0), triggered (at 512).
            for base in [0usize, 512] {
                assert_eq!(&b[base..base + 100], &pattern(100, 1 + r)[..], "region {r} write at {base}");
            }
            // 40, + 3 per pass (atomic, inject atomic, fetch-add); cswap
            // 7 -> 9 -> 11.
            assert_eq!(u64::from_le_bytes(b[1024..1032].try_into().unwrap()), 40 + 2 * 3, "region {r} sums");
            assert_eq!(u64::from_le_bytes(b[1032..1040].try_into().unwrap()), 11, "region {r} cswaps");
        }
        let mut tags: Vec<u8> = rx.iter().map(|b| b[0]).collect();
        tags.sort();
        assert_eq!(tags, [1, 2, 3, 4]);
        w.barrier();
        umr.close().unwrap();
        return;
    }
    let k = share(&w, "keys", &[], 1);
    let dest = w.addrs[1];
    let (go, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    let sends: Vec<Vec<u8>> = (1..=4u8).map(|i| vec![i; 32]).collect();
    let writes: Vec<Vec<u8>> = (0..2u64).map(|r| pattern(100, 1 + r)).collect();
    let one = 1u64.to_le_bytes();
    let (seven, nine, eleven) = (7u64.to_le_bytes(), 9u64.to_le_bytes(), 11u64.to_le_bytes());
    // Results, per (pass, region): read 64 B, fetch 8 B, compare 8 B.
    let mut reads = vec![[0u8; 64]; 4];
    let mut fetched = [[0u8; 8]; 4];
    let mut compared = [[0u8; 8]; 4];
    let iocs: Vec<([RmaIoc; 1], [RmaIoc; 1])> =
        k.iter().map(|&key| ([RmaIoc { addr: 1024, count: 1, key }], [RmaIoc { addr: 1032, count: 1, key }])).collect();
    let (r0, r1) = reads.split_at_mut(2);
    let (f0, f1) = fetched.split_at_mut(2);
    let (c0, c1) = compared.split_at_mut(2);
    for (pass, (rd, fe, co)) in [(r0, f0, c0), (r1, f1, c1)].into_iter().enumerate() {
        let threshold = 1 + pass as u64;
        let base = 512 * pass as u64;
        let ctx = |i: usize| 1000 * (pass + 1) + i;
        let s0 = [IoSlice::new(&sends[2 * pass])];
        let s1 = [IoSlice::new(&sends[2 * pass + 1])];
        let m0 = SendMsg { iov: &s0, dest, context: ctx(0), data: 0, tag: 0 };
        let m1 = SendMsg { iov: &s1, dest, context: ctx(1), data: 0, tag: 5 };
        submit(&w, &go, &done, threshold, pass == 0, DeferredOp::Send { ep: &w.ep, msg: m0, flags: 0 });
        submit(&w, &go, &done, threshold, pass == 0, DeferredOp::Tsend { ep: &w.ep, msg: m1, flags: 0 });
        let (cmp, new) = if pass == 0 { (&seven, &nine) } else { (&nine, &eleven) };
        for (r, ((&key, (sum_ioc, cas_ioc)), ((rbuf, f), c))) in
            k.iter().zip(&iocs).zip(rd.iter_mut().zip(fe.iter_mut()).zip(co.iter_mut())).enumerate()
        {
            let wiov = [IoSlice::new(&writes[r])];
            let wr = [RmaIov { addr: base, len: 100, key }];
            let op = DeferredOp::Write {
                ep: &w.ep,
                iov: &wiov,
                rma_iov: &wr,
                dest,
                context: ctx(10 + r),
                data: 0,
                flags: 0,
            };
            submit(&w, &go, &done, threshold, pass == 0, op);
            let mut riov = [IoSliceMut::new(rbuf)];
            let rr = [RmaIov { addr: 2048, len: 64, key }];
            let op = DeferredOp::Read { ep: &w.ep, iov: &mut riov, rma_iov: &rr, dest, context: ctx(20 + r), flags: 0 };
            submit(&w, &go, &done, threshold, pass == 0, op);
            let op =
                DeferredOp::Atomic { ep: &w.ep, msg: am(AtomicOp::Sum, sum_ioc, &one, dest, ctx(30 + r)), flags: 0 };
            submit(&w, &go, &done, threshold, pass == 0, op);
            let msg = am(AtomicOp::Sum, sum_ioc, &one, dest, ctx(40 + r));
            submit(&w, &go, &done, threshold, pass == 0, DeferredOp::Atomic { ep: &w.ep, msg, flags: FI_INJECT });
            let msg = am(AtomicOp::Sum, sum_ioc, &one, dest, ctx(50 + r));
            let op = DeferredOp::FetchAtomic { ep: &w.ep, msg, result: f, flags: 0 };
            submit(&w, &go, &done, threshold, pass == 0, op);
            let msg = am(AtomicOp::Cswap, cas_ioc, new, dest, ctx(60 + r));
            let op = DeferredOp::CompareAtomic { ep: &w.ep, msg, compare: cmp, result: c, flags: 0 };
            submit(&w, &go, &done, threshold, pass == 0, op);
        }
    }
    let per_pass = 2 + 2 * 6;
    assert_eq!(w.dom.queued_work().unwrap(), 2 * per_pass);
    std::thread::sleep(Duration::from_millis(20));
    w.dom.progress().unwrap();
    assert_eq!(done.read().unwrap(), 0, "nothing fired below the threshold");
    // Deferred pass: the completion counter counts each, the CQ holds none.
    go.add(1).unwrap();
    wait_value(&w, &done, per_pass as u64, "deferred work of every type");
    assert_eq!(done.readerr().unwrap(), 0);
    std::thread::sleep(Duration::from_millis(20));
    assert!(drain(&w.cq).is_empty(), "deferred work wrote CQ entries");
    // Triggered pass: each completes on the CQ with its call's flags.
    go.add(1).unwrap();
    let mut seen = Vec::new();
    for c in [0, 1, 10, 11, 20, 21, 30, 31, 40, 41, 50, 51, 60, 61] {
        let e = w.ok(2000 + c);
        seen.push(e.flags);
    }
    assert_eq!(seen[0], FI_SEND | FI_MSG);
    assert_eq!(seen[1], FI_SEND | FI_TAGGED);
    assert_eq!(seen[2], FI_RMA | FI_WRITE);
    assert_eq!(seen[4], FI_RMA | FI_READ);
    assert_eq!(seen[6], FI_ATOMIC | FI_WRITE);
    assert_eq!(seen[10], FI_ATOMIC | FI_READ);
    assert_eq!(seen[12], FI_ATOMIC | FI_READ);
    assert_eq!(done.read().unwrap(), per_pass as u64, "triggered operations have no completion counter");
    for (i, r) in reads.iter().enumerate() {
        assert_eq!(&r[..], &pattern(64, 3)[..], "read {i}");
    }
    // Fetches: deferred pass saw 40 + 1 (atomic) + 1 (inject atomic) = 42
    // before its fetch-add, the triggered pass 42 + 1 + 2 = 45.
    for r in 0..2 {
        assert_eq!(u64::from_le_bytes(fetched[r]), 42, "fetch, deferred, region {r}");
        assert_eq!(u64::from_le_bytes(fetched[2 + r]), 45, "fetch, triggered, region {r}");
        assert_eq!(u64::from_le_bytes(compared[r]), 7, "cswap, deferred, region {r}");
        assert_eq!(u64::from_le_bytes(compared[2 + r]), 9, "cswap, triggered, region {r}");
    }
    w.barrier();
    w.barrier();
}

fn am<'a>(op: AtomicOp, ioc: &'a [RmaIoc], buf: &'a [u8], dest: u64, context: usize) -> AtomicMsg<'a> {
    AtomicMsg { dt: AtomicType::Uint64, op, buf, rma_ioc: ioc, dest, context, data: 0 }
}

/// Queues `op` as deferred work (`deferred`) or as a triggered operation
/// of its endpoint, at `threshold` of `go`.
fn submit<'a>(w: &'a World, go: &'a Counter, done: &'a Counter, threshold: u64, deferred: bool, op: DeferredOp<'a>) {
    if deferred {
        let wk = DeferredWork { threshold, triggering: go, completion: Some(done), op };
        // SAFETY: every buffer lives until the end of the rank's body,
        // after the completions are counted.
        unsafe { w.dom.queue_work(wk).unwrap() };
        return;
    }
    let t = w.ep.triggered(Trigger { cntr: go, threshold });
    // SAFETY: as above.
    unsafe {
        match op {
            DeferredOp::Send { msg, flags, .. } => t.sendmsg(msg, flags),
            DeferredOp::Tsend { msg, flags, .. } => t.tsendmsg(msg, flags),
            DeferredOp::Write { iov, rma_iov, dest, context, data, flags, .. } => {
                t.writemsg(iov, rma_iov, dest, context, data, flags)
            }
            DeferredOp::Read { iov, rma_iov, dest, context, flags, .. } => {
                t.readmsg(iov, rma_iov, dest, context, flags)
            }
            DeferredOp::Atomic { msg, flags, .. } => t.atomicmsg(msg, flags),
            DeferredOp::FetchAtomic { msg, result, flags, .. } => t.fetch_atomicmsg(msg, result, flags),
            DeferredOp::CompareAtomic { msg, compare, result, flags, .. } => {
                t.compare_atomicmsg(msg, compare, result, flags)
            }
            _ => unreachable!("no other op here"),
        }
        .unwrap()
    }
}

#[test]
fn every_op_type_fired() {
    run("every_op_type_fired", 2, &[], T, every_op);
}

#[test]
fn every_op_type_fired_through_the_mailbox() {
    run("every_op_type_fired_through_the_mailbox", 2, &[("SHMFAB_CMA", "off")], T, every_op);
}

/// Work on rank 1 waits on an FI_RMA_EVENT counter of its registration
/// (user memory: counted by rank 0's single copy, or by rank 1's mailbox
/// service with single copy off); rank 0's third write fires it.
fn remote_event(w: World) {
    if w.rank == 1 {
        let mut user = vec![0u64; 512];
        // SAFETY: `user` outlives the registration, closed at the end.
        let mut mr = unsafe { w.dom.mr_reg(user.as_mut_ptr().cast(), 4096, RW).unwrap() };
        let (hits, out) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        mr.bind_counter(&hits, FI_REMOTE_WRITE).unwrap();
        // SAFETY: counter operations name no buffer.
        unsafe { w.dom.queue_work(cntr_add(&hits, 3, &out, 1)).unwrap() };
        share(&w, "keys", &[mr.key()], 0);
        out.wait(1, Some(Duration::from_secs(60))).unwrap();
        assert_eq!(hits.read().unwrap(), 3);
        w.barrier();
        mr.close().unwrap();
        drop(user);
    } else {
        let k = share(&w, "keys", &[], 1);
        for i in 0..3u64 {
            w.ep.write(&i.to_le_bytes(), w.addrs[1], 8 * i, k[0], 1).unwrap();
            w.ok(1);
        }
        w.barrier();
    }
}

#[test]
fn remote_write_counter_fires_work() {
    run("remote_write_counter_fires_work", 2, &[], T, remote_event);
}

#[test]
fn remote_write_counter_fires_work_through_the_mailbox() {
    run("remote_write_counter_fires_work_through_the_mailbox", 2, &[("SHMFAB_CMA", "off")], T, remote_event);
}

/// A chain of 1,000 deferred writes across 4 ranks: op k runs on rank k % 4
/// when that rank's remote-write counter reaches k / 4 + 1, and writes k
/// into slot k of rank (k + 1) % 4's heap, which moves that rank's counter
/// (FI_RMA_EVENT). Rank 0 starts it with an add of its own.
///
/// With `SHMFAB_CMA=off` the targets are user memory, reached through the
/// target's mailbox: each write then waits, inside its initiator's
/// progress pass, for the target's pass to serve it, which counts the
/// target's counter and fires its next write from that same pass.
fn chain(w: World) {
    const N: usize = 1000;
    let mailbox = std::env::var("SHMFAB_CMA").is_ok_and(|v| v == "off");
    let mut user = vec![0u64; N];
    let mut mr = if mailbox {
        // SAFETY: `user` outlives the registration, closed at the end.
        unsafe { w.dom.mr_reg(user.as_mut_ptr().cast(), 8 * N, RW).unwrap() }
    } else {
        w.dom.alloc_shared(8 * N, RW).unwrap()
    };
    let (hits, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    mr.bind_counter(&hits, FI_REMOTE_WRITE).unwrap();
    let keys = share(&w, "key", &[mr.key()], (w.rank + 1) % w.size);
    let next = w.addrs[(w.rank + 1) % w.size];
    let mine: Vec<usize> = (0..N).filter(|k| k % w.size == w.rank).collect();
    let vals: Vec<[u8; 8]> = mine.iter().map(|&k| (k as u64 + 1).to_le_bytes()).collect();
    let iovs: Vec<[IoSlice<'_>; 1]> = vals.iter().map(|v| [IoSlice::new(v)]).collect();
    let rmas: Vec<[RmaIov; 1]> = mine.iter().map(|&k| [RmaIov { addr: 8 * k as u64, len: 8, key: keys[0] }]).collect();
    for (i, &k) in mine.iter().enumerate() {
        let op = DeferredOp::Write {
            ep: &w.ep,
            iov: &iovs[i],
            rma_iov: &rmas[i],
            dest: next,
            context: k,
            data: 0,
            flags: 0,
        };
        let wk = DeferredWork { threshold: (k / w.size) as u64 + 1, triggering: &hits, completion: Some(&done), op };
        // SAFETY: vals, iovs and rmas live until the chain is over (below).
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    w.barrier();
    let t0 = Instant::now();
    if w.rank == 0 {
        hits.add(1).unwrap();
    }
    done.wait(mine.len() as u64, Some(Duration::from_secs(90))).unwrap();
    // Every op of the rank before us wrote to us (and rank 0 added one).
    let want_hits = (N / w.size) as u64 + (w.rank == 0) as u64;
    wait_value(&w, &hits, want_hits, "hits");
    eprintln!("rank {}: {} hops of the chain in {:?}", w.rank, mine.len(), t0.elapsed());
    w.barrier();
    // Slot k of our memory holds k + 1 for every k whose op targets us.
    let prev = (w.rank + w.size - 1) % w.size;
    for k in (0..N).filter(|k| k % w.size == prev) {
        let got = if mailbox {
            // SAFETY: our buffer; the writes to it are done (barrier).
            unsafe { std::ptr::read_volatile(&user[k]) }
        } else {
            heap_u64(&mr, 8 * k)
        };
        assert_eq!(got, k as u64 + 1, "slot {k}");
    }
    assert_eq!(done.readerr().unwrap(), 0);
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    w.barrier();
    mr.close().unwrap();
    drop(user);
}

#[test]
fn chain_of_1000_across_4_ranks() {
    run("chain_of_1000_across_4_ranks", 4, &[], Duration::from_secs(180), chain);
}

#[test]
fn chain_of_1000_across_4_ranks_through_the_mailbox() {
    run(
        "chain_of_1000_across_4_ranks_through_the_mailbox",
        4,
        &[("SHMFAB_CMA", "off")],
        Duration::from_secs(180),
        chain,
    );
}

/// With auto progress, rank 1's deferred write fires when rank 0's write
/// lands in rank 1's heap while rank 1's application only sleeps (it calls
/// nothing of shmfab until rank 0 says it saw the result).
fn auto(w: World) {
    let heap = w.dom.alloc_shared(4096, RW).unwrap();
    let peer = 1 - w.rank;
    if w.rank == 1 {
        let (hits, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        heap.bind_counter(&hits, FI_REMOTE_WRITE).unwrap();
        let k = share(&w, "key", &[heap.key()], peer);
        let val = 0xfeed_u64.to_le_bytes();
        let iov = [IoSlice::new(&val)];
        let rma = [RmaIov { addr: 64, len: 8, key: k[0] }];
        let op = DeferredOp::Write {
            ep: &w.ep,
            iov: &iov,
            rma_iov: &rma,
            dest: w.addrs[peer],
            context: 0,
            data: 0,
            flags: 0,
        };
        let wk = DeferredWork { threshold: 1, triggering: &hits, completion: Some(&done), op };
        // SAFETY: val, iov and rma outlive the work (the app waits below).
        unsafe { w.dom.queue_work(wk).unwrap() };
        w.dom.start_progress_thread().unwrap();
        w.barrier();
        // Sleep: only look at our heap, where rank 0 writes 1 once it saw
        // the fired write.
        let t0 = Instant::now();
        while heap_u64(&heap, 0) != 1 {
            assert!(t0.elapsed() < Duration::from_secs(30), "the work did not fire while the application slept");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(done.read().unwrap(), 1);
    } else {
        let k = share(&w, "key", &[heap.key()], peer);
        w.barrier();
        w.ep.write(&7u64.to_le_bytes(), w.addrs[peer], 8, k[0], 1).unwrap();
        w.ok(1);
        let t0 = Instant::now();
        while heap_u64(&heap, 64) != 0xfeed {
            assert!(t0.elapsed() < Duration::from_secs(30), "rank 1's deferred write never came");
            std::thread::sleep(Duration::from_millis(1));
        }
        w.ep.write(&1u64.to_le_bytes(), w.addrs[peer], 0, k[0], 2).unwrap();
        w.ok(2);
    }
    w.barrier();
}

#[test]
fn auto_progress_fires_while_the_application_sleeps() {
    run("auto_progress_fires_while_the_application_sleeps", 2, &[("SHMFAB_THREADING", "safe")], T, auto);
}

/// Deferred sends that find no room (rank 1 does not drain its ring for a
/// while, and the transmit queue holds 2 sends) keep their place: later
/// passes issue them, in order, and every one completes.
fn no_room(w: World) {
    const N: usize = 4000;
    if w.rank == 1 {
        w.barrier();
        std::thread::sleep(Duration::from_millis(200));
        let mut bufs = vec![[0u8; 8]; N];
        for (i, b) in bufs.iter_mut().enumerate() {
            // SAFETY: bufs outlives the receives, completed below.
            unsafe { w.ep.recv(b, w.addrs[0], i).unwrap() };
        }
        for i in 0..N {
            w.ok(i);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert_eq!(u64::from_le_bytes(*b), i as u64, "message {i} out of order");
        }
        w.barrier();
        return;
    }
    let (go, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    let vals: Vec<[u8; 8]> = (0..N as u64).map(|i| i.to_le_bytes()).collect();
    let iovs: Vec<[IoSlice<'_>; 1]> = vals.iter().map(|v| [IoSlice::new(v)]).collect();
    for iov in &iovs {
        let msg = SendMsg { iov, dest: w.addrs[1], context: 0, data: 0, tag: 0 };
        let wk = DeferredWork {
            threshold: 1,
            triggering: &go,
            completion: Some(&done),
            op: DeferredOp::Send { ep: &w.ep, msg, flags: 0 },
        };
        // SAFETY: vals and iovs outlive the sends (done counts them all below).
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    w.barrier();
    go.add(1).unwrap();
    let left = w.dom.queued_work().unwrap();
    assert!(left > 0, "all {N} sends issued at once: the test needs a smaller queue");
    done.wait(N as u64, Some(Duration::from_secs(60))).unwrap();
    assert_eq!((done.readerr().unwrap(), w.dom.queued_work().unwrap()), (0, 0));
    w.barrier();
}

#[test]
fn deferred_sends_without_room_wait_their_turn() {
    run("deferred_sends_without_room_wait_their_turn", 2, &[("SHMFAB_TX_SIZE", "2")], T, no_room);
}

/// An endpoint of `w`'s domain with its own CQ and a receive counter.
fn rx_endpoint(w: &World) -> (Endpoint, CompletionQueue, Counter) {
    let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
    let rc = w.dom.cntr_open().unwrap();
    let ep = w.dom.endpoint().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_cntr(&rc, FI_RECV).unwrap();
    ep.bind_av(&w.av).unwrap();
    ep.enable().unwrap();
    (ep, cq, rc)
}

/// Drives progress for a while (the time a wrongly posted receive would
/// take to show).
fn settle(w: &World) {
    for _ in 0..20 {
        w.dom.progress().unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Deferred receives (FI_OP_RECV / FI_OP_TRECV): posted when their
/// counter reaches the threshold, so a message sent before waits as
/// unexpected until then and is matched at once; the completion counter
/// counts when the message arrives, not when the receive is posted; no CQ
/// entry or endpoint counter without FI_COMPLETION, both with it;
/// receives fire by threshold then submission (also past several
/// thresholds at once) and in order with other deferred work on the same
/// counter; a truncated one counts the completion counter's error value;
/// cancelled and flushed ones never post; a directed source is kept.
fn deferred_recv(w: World) {
    let me = w.addrs[0];
    let (rx, rcq, rcnt) = rx_endpoint(&w);
    let rx_addr = w.av.insert(&[rx.getname()]).unwrap()[0];
    let (go, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());

    // 1. A tagged receive into two segments, directed at `w.ep`'s address,
    // queued at threshold 2; the message is sent before the threshold.
    let data = pattern(100, 3);
    let (mut h, mut t) = (vec![0u8; 40], vec![0u8; 60]);
    {
        let mut iov = [IoSliceMut::new(&mut h), IoSliceMut::new(&mut t)];
        let msg = RecvMsg { iov: &mut iov, src: me, context: 31, tag: 5, ignore: 0 };
        let wk = DeferredWork {
            threshold: 2,
            triggering: &go,
            completion: Some(&done),
            op: DeferredOp::Trecv { ep: &rx, msg, flags: 0 },
        };
        // SAFETY: h and t outlive the receive (its completion counter is
        // awaited below).
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    // SAFETY: data outlives the send, completed below.
    unsafe { w.ep.tsend(&data, rx_addr, 5, 32).unwrap() };
    w.ok(32);
    go.add(1).unwrap();
    settle(&w);
    assert_eq!(done.read().unwrap(), 0, "below its threshold: not posted");
    assert_eq!(w.dom.queued_work().unwrap(), 1);
    go.add(1).unwrap();
    wait_value(&w, &done, 1, "deferred trecv matching an unexpected message");
    assert_eq!([&h[..], &t[..]].concat(), data, "the message, across both segments");
    assert_eq!(rcnt.read().unwrap(), 0, "no endpoint counter without FI_COMPLETION");
    assert!(drain(&rcq).is_empty(), "no CQ entry without FI_COMPLETION");

    // 2. Counted on arrival, not when posted; FI_COMPLETION: entry and
    // endpoint counter too.
    let mut b = [0u8; 16];
    {
        let mut iov = [IoSliceMut::new(&mut b)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 33, tag: 0, ignore: 0 };
        let wk = DeferredWork {
            threshold: 3,
            triggering: &go,
            completion: Some(&done),
            op: DeferredOp::Recv { ep: &rx, msg, flags: FI_COMPLETION },
        };
        // SAFETY: b outlives the receive.
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    go.add(1).unwrap();
    assert_eq!(w.dom.queued_work().unwrap(), 0, "fired: posted");
    settle(&w);
    assert_eq!(done.read().unwrap(), 1, "posted, but no message yet: not counted");
    // SAFETY: a constant buffer, injected.
    w.ep.inject(b"0123456789abcdef", rx_addr).unwrap();
    wait_value(&w, &done, 2, "deferred recv counted on arrival");
    assert_eq!(&b, b"0123456789abcdef");
    assert_eq!(rcnt.read().unwrap(), 1, "FI_COMPLETION: the endpoint counter counts");
    let e = drain(&rcq);
    assert_eq!(e.len(), 1);
    assert_eq!((e[0].op_context, e[0].flags, e[0].len), (33, FI_RECV | FI_MSG, 16));

    // 3. Order: tagged receives of one tag at thresholds 2, 1, 2 (and a
    // counter add at 1 between them) fire by threshold then submission
    // when the counter jumps 0 -> 2: the receive at 1 takes the first
    // message, the first at 2 the second, the last the third.
    let (g, seen) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    let mut bufs = [[0u8; 8]; 3];
    let [b0, b1, b2] = &mut bufs;
    for (i, (buf, th)) in [(b0, 2u64), (b1, 1), (b2, 2)].into_iter().enumerate() {
        let mut iov = [IoSliceMut::new(buf)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 40 + i, tag: 9, ignore: 0 };
        let wk = DeferredWork {
            threshold: th,
            triggering: &g,
            completion: Some(&done),
            op: DeferredOp::Trecv { ep: &rx, msg, flags: FI_COMPLETION },
        };
        // SAFETY: bufs outlive the receives.
        unsafe { w.dom.queue_work(wk).unwrap() };
        if i == 1 {
            // SAFETY: a counter operation.
            unsafe { w.dom.queue_work(cntr_add(&g, 1, &seen, 1)).unwrap() };
        }
    }
    g.set(2).unwrap();
    assert_eq!(seen.read().unwrap(), 1);
    for k in 0..3u64 {
        w.ep.tinject(&(100 + k).to_le_bytes(), rx_addr, 9).unwrap();
    }
    wait_value(&w, &done, 5, "three ordered receives");
    let got: Vec<(usize, u64)> = drain(&rcq).iter().map(|e| (e.op_context, e.len as u64)).collect();
    assert_eq!(got, [(41, 8), (40, 8), (42, 8)], "completions in posting order");
    let vals: Vec<u64> = bufs.iter().map(|b| u64::from_le_bytes(*b)).collect();
    assert_eq!(vals, [101, 100, 102], "threshold 1 first, then the two at 2 in submission order");

    // 4. A truncated deferred receive counts the error value.
    let mut small = [0u8; 4];
    {
        let mut iov = [IoSliceMut::new(&mut small)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 50, tag: 0, ignore: 0 };
        let wk = DeferredWork {
            threshold: 4,
            triggering: &go,
            completion: Some(&done),
            op: DeferredOp::Recv { ep: &rx, msg, flags: 0 },
        };
        // SAFETY: small outlives the receive.
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    go.add(1).unwrap();
    w.ep.inject(b"too long for it", rx_addr).unwrap();
    let t0 = Instant::now();
    while done.readerr().unwrap() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(30), "truncation never counted");
        w.dom.wait(Some(Duration::from_millis(1)));
    }
    assert_eq!((done.read().unwrap(), done.readerr().unwrap()), (5, 1));
    assert!(drain(&rcq).is_empty(), "quiet: no error entry either");

    // 5. Cancel and flush: the receives never post; the message they
    // would have taken waits for an ordinary receive.
    let mut never = [0u8; 8];
    let id = {
        let mut iov = [IoSliceMut::new(&mut never)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 60, tag: 77, ignore: 0 };
        let wk = DeferredWork {
            threshold: 5,
            triggering: &go,
            completion: Some(&done),
            op: DeferredOp::Trecv { ep: &rx, msg, flags: 0 },
        };
        // SAFETY: never outlives the work (cancelled below).
        unsafe { w.dom.queue_work(wk).unwrap() }
    };
    let flushed = w.dom.cntr_open().unwrap();
    {
        let mut iov = [IoSliceMut::new(&mut never)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 61, tag: 77, ignore: 0 };
        let wk = DeferredWork {
            threshold: 1,
            triggering: &flushed,
            completion: Some(&done),
            op: DeferredOp::Trecv { ep: &rx, msg, flags: 0 },
        };
        // SAFETY: as above (flushed below).
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    assert!(w.dom.cancel_work(id).unwrap());
    assert_eq!(w.dom.flush_work(Some(&flushed)).unwrap(), 1);
    go.add(1).unwrap();
    flushed.add(1).unwrap();
    w.ep.tinject(&7u64.to_le_bytes(), rx_addr, 77).unwrap();
    settle(&w);
    assert_eq!(never, [0u8; 8], "cancelled and flushed receives never post");
    assert_eq!((done.read().unwrap(), done.readerr().unwrap()), (5, 1));
    let mut late = [0u8; 8];
    // SAFETY: late outlives the receive.
    unsafe { rx.trecv(&mut late, FI_ADDR_UNSPEC, 77, 0, 62).unwrap() };
    let t0 = Instant::now();
    let e = loop {
        let e = drain(&rcq);
        if !e.is_empty() {
            break e;
        }
        assert!(t0.elapsed() < Duration::from_secs(30));
        w.dom.wait(Some(Duration::from_millis(1)));
    };
    assert_eq!(e[0].op_context, 62);
    assert_eq!(u64::from_le_bytes(late), 7, "the message waited for an ordinary receive");
    flushed.close().unwrap();
    assert_eq!(w.dom.queued_work().unwrap(), 0);

    // 6. A directed source not in the AV when it fires: an error
    // completion (FI_COMPLETION: on the endpoint too), never posted.
    let errs0 = done.readerr().unwrap();
    {
        let mut iov = [IoSliceMut::new(&mut never)];
        let msg = RecvMsg { iov: &mut iov, src: 999, context: 63, tag: 0, ignore: 0 };
        let wk = DeferredWork {
            threshold: 1,
            triggering: &go,
            completion: Some(&done),
            op: DeferredOp::Recv { ep: &rx, msg, flags: FI_COMPLETION },
        };
        // SAFETY: never outlives the work (it fails at once: go is past 1).
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    assert_eq!(done.readerr().unwrap(), errs0 + 1);
    let e = rcq.readerr().unwrap();
    assert_eq!((e.op_context, e.err), (63, ErrorKind::AddrNotAvail.errno()));
    assert_eq!(rcnt.readerr().unwrap(), 1, "FI_COMPLETION: the endpoint counter's error value");
    w.ep.inject(b"any", rx_addr).unwrap();
    settle(&w);
    assert_eq!(never, [0u8; 8], "never posted");
}

#[test]
fn deferred_receives() {
    run("deferred_receives", 1, &[], T, deferred_recv);
}

/// Triggered receives (FI_TRIGGER on fi_recvmsg / fi_trecvmsg): posted
/// when the trigger fires and completing as a receive posted then would
/// (CQ entry, endpoint counter); fi_cancel of the context of a triggered
/// operation not yet fired (a receive, a send, a write, an atomic) takes
/// it off the queue with an FI_ECANCELED error entry, and after it fired
/// cancels the posted receive; closing the endpoint drops its triggered operations (their
/// counters free again) while deferred work naming it fails when fired
/// and a fired deferred receive still posted counts its error value.
fn triggered_recv(w: World) {
    let me = w.addrs[0];
    let (rx, rcq, rcnt) = rx_endpoint(&w);
    let rx_addr = w.av.insert(&[rx.getname()]).unwrap()[0];
    let go = w.dom.cntr_open().unwrap();
    let mut b = [0u8; 8];
    {
        let mut iov = [IoSliceMut::new(&mut b)];
        let m = RecvMsg { iov: &mut iov, src: me, context: 70, tag: 3, ignore: 0 };
        // SAFETY: b outlives the receive.
        unsafe { rx.triggered(Trigger { cntr: &go, threshold: 1 }).trecvmsg(m, 0).unwrap() };
    }
    w.ep.tinject(&11u64.to_le_bytes(), rx_addr, 3).unwrap();
    settle(&w);
    assert!(drain(&rcq).is_empty() && b == [0; 8], "not posted before its trigger");
    go.add(1).unwrap();
    let t0 = Instant::now();
    let e = loop {
        let e = drain(&rcq);
        if !e.is_empty() {
            break e;
        }
        assert!(t0.elapsed() < Duration::from_secs(30));
        w.dom.wait(Some(Duration::from_millis(1)));
    };
    assert_eq!((e[0].op_context, e[0].flags, e[0].tag), (70, FI_RECV | FI_TAGGED, 3));
    assert_eq!(u64::from_le_bytes(b), 11);
    assert_eq!(rcnt.read().unwrap(), 1);

    // fi_cancel: a triggered receive and a triggered send not fired.
    let mut c = [0u8; 8];
    {
        let mut iov = [IoSliceMut::new(&mut c)];
        let m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 71, tag: 0, ignore: 0 };
        // SAFETY: c outlives the receive (cancelled below).
        unsafe { rx.triggered(Trigger { cntr: &go, threshold: 5 }).recvmsg(m, 0).unwrap() };
    }
    let payload = [1u8; 8];
    let iov = [IoSlice::new(&payload)];
    let m = SendMsg { iov: &iov, dest: me, context: 72, data: 0, tag: 0 };
    // SAFETY: payload outlives the send (cancelled below).
    unsafe { rx.triggered(Trigger { cntr: &go, threshold: 5 }).sendmsg(m, 0).unwrap() };
    assert_eq!(w.dom.queued_work().unwrap(), 2);
    assert!(rx.cancel(72).unwrap());
    assert!(rx.cancel(71).unwrap());
    assert!(!rx.cancel(71).unwrap(), "cancelled once");
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    let mut errs = Vec::new();
    while let Ok(ee) = rcq.readerr() {
        errs.push((ee.op_context, ee.err, ee.flags & (FI_SEND | FI_RECV)));
    }
    let canceled = ErrorKind::Canceled.errno();
    assert_eq!(errs, [(72, canceled, FI_SEND), (71, canceled, FI_RECV)]);
    go.add(10).unwrap();
    settle(&w);
    assert!(drain(&rcq).is_empty(), "cancelled triggered operations never run");
    // A triggered write and a triggered atomic not fired: the same (they
    // never reach their target: the key names nothing, and no error of
    // theirs comes but the cancel's).
    let bogus = [RmaIov { addr: 0, len: 8, key: 0xdead_0000 }];
    let biov = [IoSlice::new(&payload)];
    // SAFETY: payload outlives the write (cancelled below).
    unsafe { rx.triggered(Trigger { cntr: &go, threshold: 100 }).writemsg(&biov, &bogus, me, 74, 0, 0).unwrap() };
    let ioc = [RmaIoc { addr: 0, count: 1, key: 0xdead_0000 }];
    // SAFETY: as above.
    unsafe {
        rx.triggered(Trigger { cntr: &go, threshold: 100 })
            .atomicmsg(am(AtomicOp::Sum, &ioc, &payload, me, 75), 0)
            .unwrap()
    };
    assert!(rx.cancel(75).unwrap() && rx.cancel(74).unwrap());
    let errs: Vec<_> = std::iter::from_fn(|| rcq.readerr().ok()).map(|e| (e.op_context, e.err, e.flags)).collect();
    assert_eq!(errs, [(75, canceled, FI_ATOMIC | FI_WRITE), (74, canceled, FI_RMA | FI_WRITE)]);
    go.add(100).unwrap();
    settle(&w);
    assert!(drain(&rcq).is_empty() && rcq.readerr().is_err(), "cancelled: never issued");
    // Fired, not matched: fi_cancel finds the posted receive.
    {
        let mut iov = [IoSliceMut::new(&mut c)];
        let m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 73, tag: 0, ignore: 0 };
        // SAFETY: as above.
        unsafe { rx.triggered(Trigger { cntr: &go, threshold: 1 }).recvmsg(m, 0).unwrap() };
    }
    assert!(rx.cancel(73).unwrap());
    assert_eq!(rcq.readerr().map(|ee| (ee.op_context, ee.err)).unwrap(), (73, canceled));

    // Endpoint close: triggered operations dropped (their counter is free
    // again); deferred work naming it fails when it fires; a fired deferred
    // receive still posted counts its completion counter's error value.
    let (gone, gcq, _gc) = rx_endpoint(&w);
    let (g2, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    let mut d = [[0u8; 8]; 3];
    let [d0, d1, d2] = &mut d;
    {
        let mut iov = [IoSliceMut::new(d0)];
        let m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 80, tag: 0, ignore: 0 };
        // SAFETY: d outlives the endpoint.
        unsafe { gone.triggered(Trigger { cntr: &g2, threshold: 1 }).recvmsg(m, 0).unwrap() };
        let mut iov = [IoSliceMut::new(d1)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 81, tag: 0, ignore: 0 };
        let wk = DeferredWork {
            threshold: 1,
            triggering: &go,
            completion: Some(&done),
            op: DeferredOp::Recv { ep: &gone, msg, flags: 0 },
        };
        // SAFETY: as above; this one fires at once (go is past 1): posted.
        unsafe { w.dom.queue_work(wk).unwrap() };
        let mut iov = [IoSliceMut::new(d2)];
        let msg = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 82, tag: 0, ignore: 0 };
        let wk = DeferredWork {
            threshold: 2,
            triggering: &done,
            completion: Some(&done),
            op: DeferredOp::Recv { ep: &gone, msg, flags: 0 },
        };
        // SAFETY: as above.
        unsafe { w.dom.queue_work(wk).unwrap() };
    }
    assert_eq!(w.dom.queued_work().unwrap(), 2, "the triggered receive and the deferred one at 2");
    assert_eq!(g2.close().unwrap_err().kind(), ErrorKind::Busy);
    gone.close().unwrap();
    assert_eq!(w.dom.queued_work().unwrap(), 1, "the triggered receive went with its endpoint");
    g2.close().unwrap();
    let mut errs = Vec::new();
    while let Ok(ee) = gcq.readerr() {
        errs.push(ee.op_context);
    }
    assert_eq!(errs, [80], "close flushes the triggered receive; the deferred one is quiet (no FI_COMPLETION)");
    assert_eq!((done.read().unwrap(), done.readerr().unwrap()), (0, 1), "the posted deferred receive failed");
    done.add(1).unwrap();
    assert_eq!((done.read().unwrap(), done.readerr().unwrap()), (1, 2), "the one that fired after the close failed");
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    assert_eq!(d, [[0u8; 8]; 3]);
}

#[test]
fn triggered_receives_and_cancel() {
    run("triggered_receives_and_cancel", 1, &[], T, triggered_recv);
}

/// What a collective library builds: rank 0 queues a receive from rank 1
/// (deferred, on `go`) and a send back to rank 1 of the buffer it fills,
/// triggered by the receive's completion counter; then only drives
/// progress. Rank 1 sends, and gets its data back: the receive's arrival
/// fired the send. Repeated, the thresholds moving, with messages inline,
/// through the pool and by rendezvous (the completion counter counts when
/// the last byte is in).
fn recv_fires_send(w: World) {
    const ROUNDS: u64 = 21;
    let size = |i: u64| [64usize, 8192, 300_000][i as usize % 3];
    if w.rank == 0 {
        let (go, got, sent) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        let mut bufs: Vec<Vec<u8>> = (0..ROUNDS).map(|i| vec![0u8; size(i)]).collect();
        for (i, buf) in bufs.iter_mut().enumerate() {
            let i = i as u64;
            let (p, n) = (buf.as_mut_ptr(), buf.len());
            let mut iov = [IoSliceMut::new(buf)];
            let msg = RecvMsg { iov: &mut iov, src: w.addrs[1], context: 0, tag: 100 + i, ignore: 0 };
            let wk = DeferredWork {
                threshold: i + 1,
                triggering: &go,
                completion: Some(&got),
                op: DeferredOp::Trecv { ep: &w.ep, msg, flags: 0 },
            };
            // SAFETY: bufs outlive the work (awaited below).
            unsafe { w.dom.queue_work(wk).unwrap() };
            // SAFETY: the same buffer, read when the send fires (after the
            // receive filled it: its completion counter moved).
            let src = unsafe { std::slice::from_raw_parts(p, n) };
            let iov = [IoSlice::new(src)];
            let msg = SendMsg { iov: &iov, dest: w.addrs[1], context: 0, data: 0, tag: 200 + i };
            let wk = DeferredWork {
                threshold: i + 1,
                triggering: &got,
                completion: Some(&sent),
                op: DeferredOp::Tsend { ep: &w.ep, msg, flags: 0 },
            };
            // SAFETY: as above.
            unsafe { w.dom.queue_work(wk).unwrap() };
        }
        w.barrier();
        // Each round: one add; the rest is the provider's.
        for r in 1..=ROUNDS {
            go.add(1).unwrap();
            wait_value(&w, &sent, r, "echo sent");
        }
        assert_eq!(got.read().unwrap(), ROUNDS);
        assert_eq!(w.dom.queued_work().unwrap(), 0);
        assert!(drain(&w.cq).is_empty(), "deferred work without FI_COMPLETION writes no entry");
        w.barrier();
    } else {
        w.barrier();
        for i in 0..ROUNDS {
            let data = pattern(size(i), i);
            let mut back = vec![0u8; size(i)];
            // SAFETY: back outlives the receive, awaited below.
            unsafe { w.ep.trecv(&mut back, w.addrs[0], 200 + i, 0, 2).unwrap() };
            // SAFETY: data outlives the send, awaited below.
            unsafe { w.ep.tsend(&data, w.addrs[0], 100 + i, 1).unwrap() };
            w.ok(1);
            w.ok(2);
            assert_eq!(&back[..], &data[..], "round {i}: the echo");
        }
        w.barrier();
    }
}

#[test]
fn receive_arrival_fires_a_send() {
    run("receive_arrival_fires_a_send", 2, &[], T, recv_fires_send);
}

#[test]
fn receive_arrival_fires_a_send_without_single_copy() {
    run("receive_arrival_fires_a_send_without_single_copy", 2, &[("SHMFAB_CMA", "off")], T, recv_fires_send);
}
