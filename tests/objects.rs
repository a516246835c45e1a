//! Object rules and argument checking (in one process: two endpoints of one
//! domain talk to each other), the layout check between builds, and the
//! removal of a SIGKILLed owner's region.

use shmfab::*;
use std::time::{Duration, Instant};

fn job(name: &str) {
    std::env::set_var("SHMFAB_JOB_ID", format!("objects-{name}-{}", std::process::id()));
}

struct Pair {
    ep0: Endpoint,
    ep1: Endpoint,
    cq0: CompletionQueue,
    cq1: CompletionQueue,
    av: AddressVector,
    dom: Domain,
    a0: FiAddr,
    a1: FiAddr,
}

fn pair_with(f0: CqFormat, sel: bool) -> Pair {
    let dom = Fabric::open().unwrap().domain().unwrap();
    let cq0 = dom.cq_open(&CqAttr { size: 64, format: f0, ..Default::default() }).unwrap();
    let cq1 = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let ep0 = dom.endpoint().unwrap();
    let ep1 = dom.endpoint().unwrap();
    let selb = if sel { FI_SELECTIVE_COMPLETION } else { 0 };
    ep0.bind_cq(&cq0, FI_TRANSMIT | FI_RECV | selb).unwrap();
    ep1.bind_cq(&cq1, FI_TRANSMIT | FI_RECV).unwrap();
    ep0.bind_av(&av).unwrap();
    ep1.bind_av(&av).unwrap();
    ep0.enable().unwrap();
    ep1.enable().unwrap();
    let a = av.insert(&[ep0.getname(), ep1.getname()]).unwrap();
    Pair { ep0, ep1, cq0, cq1, av, dom, a0: a[0], a1: a[1] }
}

fn read_one<T: shmfab::cq::CqFormatEntry>(cq: &CompletionQueue) -> Result<T> {
    let t0 = Instant::now();
    loop {
        let mut e = [T::default()];
        match cq.read(&mut e) {
            Ok(_) => return Ok(e[0]),
            Err(x) if x.kind() == ErrorKind::Again && t0.elapsed() < Duration::from_secs(10) => {}
            Err(x) => return Err(x),
        }
    }
}

#[test]
fn close_while_bound_is_busy() {
    job("busy");
    let dom = Fabric::open().unwrap().domain().unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let c = dom.cntr_open().unwrap();
    let ep = dom.endpoint().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.bind_cntr(&c, FI_SEND).unwrap();
    for e in [cq.close().unwrap_err(), av.close().unwrap_err(), c.close().unwrap_err()] {
        assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
    }
    // Still usable after the refused close.
    assert_eq!(c.read().unwrap(), 0);
    ep.close().unwrap();
    cq.close().unwrap();
    av.close().unwrap();
    c.close().unwrap();
    assert_eq!(c.read().unwrap_err().kind(), ErrorKind::Inval, "closed counter");
    // A closed CQ's reads are refused, also once a new CQ took its slot
    // (the read finds the state by its id, with no test, once it has
    // checked the handle open under the lock).
    let cq2 = dom.cq_open(&CqAttr::default()).unwrap();
    let mut e = [CqTaggedEntry::default(); 2];
    assert_eq!(cq.read(&mut e).unwrap_err().kind(), ErrorKind::Inval, "closed CQ");
    assert_eq!(cq2.read(&mut e).unwrap_err().kind(), ErrorKind::Again, "the new CQ is empty");
    // The other calls on the closed handle, too (they once checked the mark
    // before the lock and then looked the slot up: the new CQ's).
    assert_eq!(cq.format().unwrap_err().kind(), ErrorKind::Inval, "closed CQ's format");
    assert_eq!(cq.readerr().unwrap_err().kind(), ErrorKind::Inval, "closed CQ's readerr");
    // Binding through closed handles whose slots were taken by new objects
    // binds nothing: the new objects stay free to close.
    let c2 = dom.cntr_open().unwrap();
    let ep2 = dom.endpoint().unwrap();
    assert_eq!(ep2.bind_cq(&cq, FI_RECV).unwrap_err().kind(), ErrorKind::Inval, "bind a closed CQ");
    assert_eq!(ep2.bind_cntr(&c, FI_RECV).unwrap_err().kind(), ErrorKind::Inval, "bind a closed counter");
    cq2.close().unwrap();
    c2.close().unwrap();
    ep2.close().unwrap();
}

/// A closed endpoint's handle refuses every call: also once a new endpoint
/// took its slot, and also when another thread closes it between two of
/// its calls (the handle reaches its state by a pointer that close frees).
#[test]
fn closed_endpoint_refuses_calls() {
    job("closedep");
    let dom = Fabric::open().unwrap().domain_with(shmfab::Threading::Safe).unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let open = || {
        let ep = dom.endpoint().unwrap();
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
        ep
    };
    let (ep0, sink) = (open(), open());
    let to = av.insert(&[sink.getname()]).unwrap()[0];
    ep0.close().unwrap();
    let ep2 = open(); // may reuse ep0's slot
    let mut b = [0u8; 8];
    assert_eq!(ep0.tinject(b"12345678", to, 1).unwrap_err().kind(), ErrorKind::Inval);
    // SAFETY: refused, so b is never written.
    assert_eq!(unsafe { ep0.trecv(&mut b, to, 1, 0, 0) }.unwrap_err().kind(), ErrorKind::Inval);
    assert_eq!(ep0.stats().unwrap_err().kind(), ErrorKind::Inval);
    ep2.tinject(b"12345678", to, 1).unwrap();
    // Closed by another thread while this one sends.
    let ep3 = std::sync::Arc::new(open());
    let closer = {
        let ep3 = ep3.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            ep3.close().unwrap();
        })
    };
    let t0 = Instant::now();
    let mut sent = 0u64;
    let err = loop {
        match ep3.tinject(b"12345678", to, 2) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == ErrorKind::Again => {
                let _ = sink.stats();
                let mut e = [CqTaggedEntry::default(); 16];
                let _ = cq.read(&mut e);
            }
            Err(e) => break e,
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the close never took effect");
    };
    closer.join().unwrap();
    assert_eq!(err.kind(), ErrorKind::Inval, "{err}");
    assert!(sent > 0);
}

#[test]
fn dropping_a_bound_cq_keeps_the_endpoint_working() {
    job("orphan");
    let p = pair_with(CqFormat::Tagged, false);
    let Pair { ep0, ep1, cq0, cq1, a1, .. } = p;
    drop(cq0); // bound: stays alive for ep0
    ep0.inject(b"still here", a1).unwrap();
    let mut b = [0u8; 10];
    // SAFETY: b outlives the completion.
    unsafe { ep1.recv(&mut b, FI_ADDR_UNSPEC, 5).unwrap() };
    let e: CqTaggedEntry = read_one(&cq1).unwrap();
    assert_eq!((e.op_context, &b), (5, b"still here"));
    drop(ep0);
}

#[test]
fn cq_formats_and_source_addresses() {
    job("formats");
    for fmt in [CqFormat::Context, CqFormat::Msg, CqFormat::Data, CqFormat::Tagged] {
        let p = pair_with(fmt, false);
        let mut b = [0u8; 16];
        // SAFETY: b outlives the completion.
        unsafe { p.ep0.trecv(&mut b, FI_ADDR_UNSPEC, 3, 0, 11).unwrap() };
        p.ep1.tinjectdata(b"0123456789", 99, p.a0, 3).unwrap();
        assert_eq!(p.cq0.format().unwrap(), fmt);
        match fmt {
            CqFormat::Context => {
                let e: CqEntry = read_one(&p.cq0).unwrap();
                assert_eq!(e.op_context, 11);
                let mut wrong = [CqTaggedEntry::default()];
                assert_eq!(p.cq0.read(&mut wrong).unwrap_err().kind(), ErrorKind::Inval);
            }
            CqFormat::Msg => {
                let e: CqMsgEntry = read_one(&p.cq0).unwrap();
                assert_eq!((e.op_context, e.len), (11, 10));
                assert_eq!(e.flags, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA);
            }
            CqFormat::Data => {
                let e: CqDataEntry = read_one(&p.cq0).unwrap();
                assert_eq!((e.op_context, e.len, e.data), (11, 10, 99));
            }
            _ => {
                let e: CqTaggedEntry = read_one(&p.cq0).unwrap();
                assert_eq!((e.op_context, e.len, e.data, e.tag), (11, 10, 99, 3));
            }
        }
    }
    // readfrom: a source in the AV gets its fi_addr; one that is not gets
    // FI_ADDR_NOTAVAIL.
    let p = pair_with(CqFormat::Tagged, false);
    let mut b = [0u8; 4];
    // SAFETY: b outlives the completion read below.
    unsafe { p.ep0.recv(&mut b, FI_ADDR_UNSPEC, 1).unwrap() };
    p.ep1.inject(b"ab", p.a0).unwrap();
    let mut e = [CqTaggedEntry::default()];
    let mut src = [0u64];
    let t0 = Instant::now();
    while p.cq0.readfrom(&mut e, &mut src).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert_eq!(src[0], p.a1);
    p.av.remove(&[p.a1]).unwrap();
    // SAFETY: b outlives the completion read below.
    unsafe { p.ep0.recv(&mut b, FI_ADDR_UNSPEC, 2).unwrap() };
    p.ep1.inject(b"cd", p.a0).unwrap();
    while p.cq0.readfrom(&mut e, &mut src).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert_eq!((e[0].op_context, src[0]), (2, FI_ADDR_NOTAVAIL));
    let mut short = [0u64; 0];
    assert_eq!(p.cq0.readfrom(&mut e, &mut short).unwrap_err().kind(), ErrorKind::Inval);
}

/// Completions a read's own progress pass writes go straight into its
/// array while it has room; the rest queue. An error entry among them
/// keeps its place: entries after it are not returned before it.
#[test]
fn read_keeps_completion_order_between_its_array_and_the_queue() {
    job("sinkorder");
    let p = pair_with(CqFormat::Tagged, false);
    // The first read that returns something (completions, or an error).
    let read_some = |e: &mut [CqTaggedEntry]| -> usize {
        let t0 = Instant::now();
        loop {
            match p.cq0.read(e) {
                Ok(n) => return n,
                Err(x) if x.kind() == ErrorKind::Again => assert!(t0.elapsed() < Duration::from_secs(10)),
                Err(x) => panic!("{x}"),
            }
        }
    };
    // The rest, by readfrom: queued entries keep their source address.
    let read_all = |want: usize| -> Vec<usize> {
        let mut got = Vec::new();
        let mut e = [CqTaggedEntry::default(); 8];
        let mut src = [0u64; 8];
        let t0 = Instant::now();
        while got.len() < want {
            match p.cq0.readfrom(&mut e[..want - got.len()], &mut src[..want - got.len()]) {
                Ok(n) => {
                    assert!(src[..n].iter().all(|&s| s == p.a1), "sources {:?}", &src[..n]);
                    got.extend(e[..n].iter().map(|x| x.op_context))
                }
                Err(x) if x.kind() == ErrorKind::Again => assert!(t0.elapsed() < Duration::from_secs(10)),
                Err(x) => panic!("{x}"),
            }
        }
        got
    };
    // Array of 2, five completions in one pass: 1 and 2 fill it, 3 fails
    // (truncated), 4 and 5 queue behind the error.
    let mut bufs = [[0u8; 8]; 5];
    for (i, b) in bufs.iter_mut().enumerate() {
        let len = if i == 2 { 4 } else { 8 };
        // SAFETY: bufs outlive the completions read below.
        unsafe { p.ep0.trecv(&mut b[..len], FI_ADDR_UNSPEC, 7, 0, i + 1).unwrap() };
    }
    for i in 0..5u8 {
        p.ep1.tinject(&[i; 8], p.a0, 7).unwrap();
    }
    let mut e = [CqTaggedEntry::default(); 2];
    let n = read_some(&mut e);
    assert_eq!((n, e[0].op_context, e[1].op_context), (2, 1, 2));
    assert_eq!(p.cq0.read(&mut e).unwrap_err().kind(), ErrorKind::Avail);
    let err = p.cq0.readerr().unwrap();
    assert_eq!((err.op_context, err.olen), (3, 4));
    assert_eq!(read_all(2), vec![4, 5]);
    assert_eq!(bufs[4], [4; 8]);
    // Array of 4, three completions: the error after the first closes the
    // array, so the third waits behind it.
    for (i, b) in bufs.iter_mut().enumerate().take(3) {
        let len = if i == 1 { 4 } else { 8 };
        // SAFETY: as above.
        unsafe { p.ep0.trecv(&mut b[..len], FI_ADDR_UNSPEC, 7, 0, 11 + i).unwrap() };
    }
    for i in 0..3u8 {
        p.ep1.tinject(&[i; 8], p.a0, 7).unwrap();
    }
    let mut e4 = [CqTaggedEntry::default(); 4];
    let n = read_some(&mut e4);
    assert_eq!((n, e4[0].op_context), (1, 11));
    assert_eq!(p.cq0.read(&mut e4).unwrap_err().kind(), ErrorKind::Avail);
    // Into a buffer of the caller's: the text copied, cut to the buffer.
    let mut text = [0u8; 200];
    let (err, n) = p.cq0.readerr_into(&mut text).unwrap();
    assert_eq!(err.op_context, 12);
    let whole = p.cq0.last_error_text().unwrap();
    assert!(n > 0 && n == whole.len() && text[..n] == *whole.as_bytes(), "{n} bytes: {whole}");
    assert!(whole.contains("truncated"), "{whole}");
    assert_eq!(read_all(1), vec![13]);
    // An error that a read's own pass finds is that read's answer (an
    // empty sink is not an empty CQ).
    let mut b = [0u8; 4];
    // SAFETY: b outlives the error completion read below.
    unsafe { p.ep0.trecv(&mut b, FI_ADDR_UNSPEC, 7, 0, 21).unwrap() };
    p.ep1.tinject(&[9; 8], p.a0, 7).unwrap();
    assert_eq!(p.cq0.read(&mut e4).unwrap_err().kind(), ErrorKind::Avail);
    let mut short = [0u8; 5];
    let (err, n) = p.cq0.readerr_into(&mut short).unwrap();
    assert_eq!((err.op_context, b, n), (21, [9; 4], 5));
    assert_eq!(short[..], p.cq0.last_error_text().unwrap().as_bytes()[..5], "cut to the caller's buffer");
    assert_eq!(p.cq0.readerr_into(&mut short).unwrap_err().kind(), ErrorKind::Again);
    drop(p.dom);
}

/// A send goes to whatever the AV says now: a removed handle fails, and a
/// handle reused by a later insert reaches the new address (the endpoint's
/// fi_addr cache is cleared on removal).
#[test]
fn sends_follow_removed_and_reused_av_handles() {
    job("avreuse");
    let p = pair_with(CqFormat::Tagged, false);
    let cq2 = p.dom.cq_open(&CqAttr::default()).unwrap();
    let ep2 = p.dom.endpoint().unwrap();
    ep2.bind_cq(&cq2, FI_TRANSMIT | FI_RECV).unwrap();
    ep2.bind_av(&p.av).unwrap();
    ep2.enable().unwrap();
    let mut b1 = [0u8; 8];
    let mut b2 = [0u8; 8];
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        p.ep1.trecv(&mut b1, FI_ADDR_UNSPEC, 9, 0, 1).unwrap();
        ep2.trecv(&mut b2, FI_ADDR_UNSPEC, 9, 0, 2).unwrap();
    }
    p.ep0.tinject(b"to-ep1.1", p.a1, 9).unwrap(); // cached now
    assert_eq!(read_one::<CqTaggedEntry>(&p.cq1).unwrap().op_context, 1);
    p.av.remove(&[p.a1]).unwrap();
    let e = p.ep0.tinject(b"nowhere!", p.a1, 9).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrNotAvail, "{e}");
    let a2 = p.av.insert(&[ep2.getname()]).unwrap()[0];
    assert_eq!(a2, p.a1, "the freed handle is reused");
    p.ep0.tinject(b"to-ep2.1", a2, 9).unwrap();
    assert_eq!(read_one::<CqTaggedEntry>(&cq2).unwrap().op_context, 2);
    assert_eq!(&b2, b"to-ep2.1");
    assert_eq!(&b1, b"to-ep1.1");
    drop((ep2, cq2));
}

#[test]
fn counters_count_and_take_add_set() {
    job("counters");
    let p = pair_with(CqFormat::Tagged, false);
    let dom = &p.dom;
    let c = dom.cntr_open().unwrap();
    c.add(5).unwrap();
    c.adderr(2).unwrap();
    assert_eq!((c.read().unwrap(), c.readerr().unwrap()), (5, 2));
    c.set(100).unwrap();
    c.seterr(0).unwrap();
    assert_eq!((c.read().unwrap(), c.readerr().unwrap()), (100, 0));

    // Counters bound to an endpoint count its completions and errors.
    let ep = dom.endpoint().unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let sent = dom.cntr_open().unwrap();
    let recvd = dom.cntr_open().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_cntr(&sent, FI_SEND).unwrap();
    ep.bind_cntr(&recvd, FI_RECV).unwrap();
    ep.bind_av(&p.av).unwrap();
    ep.enable().unwrap();
    let me = p.av.insert(&[ep.getname()]).unwrap()[0];
    let mut b = [0u8; 4];
    for i in 0..3 {
        // SAFETY: b outlives the completion counted below.
        unsafe { ep.recv(&mut b, FI_ADDR_UNSPEC, i).unwrap() };
        ep.inject(b"1234", me).unwrap();
    }
    // SAFETY: b outlives the completion counted below.
    unsafe { ep.recv(&mut b[..2], FI_ADDR_UNSPEC, 9).unwrap() };
    ep.inject(b"too long", me).unwrap();
    let t0 = Instant::now();
    while recvd.read().unwrap() + recvd.readerr().unwrap() < 4 {
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    assert_eq!((recvd.read().unwrap(), recvd.readerr().unwrap()), (3, 1), "one truncated receive is an error");
    assert_eq!(sent.read().unwrap(), 4, "inject counts on the send counter");
    assert_ne!(sent.index(), recvd.index());
    drop(ep);
}

#[test]
fn selective_completion() {
    job("selective");
    let p = pair_with(CqFormat::Tagged, true);
    let big = vec![1u8; 300_000];
    let mut rb = vec![0u8; 300_000];
    // SAFETY: big and rb outlive the completions read below.
    unsafe {
        p.ep1.recv(&mut rb, FI_ADDR_UNSPEC, 1).unwrap();
        p.ep1.recv(&mut rb, FI_ADDR_UNSPEC, 2).unwrap();
        // No FI_COMPLETION: no entry.
        p.ep0.send(b"quiet", p.a1, 100).unwrap();
        let iov = [std::io::IoSlice::new(&big)];
        p.ep0.sendmsg(&SendMsg { iov: &iov, dest: p.a1, context: 101, data: 0, tag: 0 }, FI_COMPLETION).unwrap();
    }
    let mut seen = Vec::new();
    let t0 = Instant::now();
    while seen.len() < 3 && t0.elapsed() < Duration::from_secs(10) {
        let mut e = [CqTaggedEntry::default()];
        if p.cq0.read(&mut e).is_ok() {
            seen.push(e[0].op_context);
        }
        if p.cq1.read(&mut e).is_ok() {
            seen.push(e[0].op_context);
        }
    }
    seen.sort();
    assert_eq!(seen, vec![1, 2, 101], "only the send that asked completes on the selective CQ");
}

/// Receive side of selective completion: a receive posted without
/// FI_COMPLETION completes on the counter only; one with it also on the CQ
/// (small messages, the inline fast path, and a large one).
#[test]
fn selective_receive_completion_counts_without_entries() {
    job("selective-rx");
    let dom = Fabric::open().unwrap().domain().unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let recvd = dom.cntr_open().unwrap();
    let ep = dom.endpoint().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION).unwrap();
    ep.bind_cntr(&recvd, FI_RECV).unwrap();
    ep.bind_av(&av).unwrap();
    ep.enable().unwrap();
    let me = av.insert(&[ep.getname()]).unwrap()[0];
    let big = vec![7u8; 200_000];
    let mut bufs = vec![vec![0u8; 200_000]; 4];
    for (i, b) in bufs.iter_mut().enumerate() {
        let mut iov = [std::io::IoSliceMut::new(b)];
        let flags = if i % 2 == 1 { FI_COMPLETION } else { 0 };
        let mut m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 10 + i, tag: 0, ignore: 0 };
        // SAFETY: bufs outlive the completions counted below.
        unsafe { ep.recvmsg(&mut m, flags).unwrap() };
    }
    ep.injectdata(b"a", 5, me).unwrap();
    ep.inject(b"bb", me).unwrap();
    ep.inject(b"ccc", me).unwrap();
    // SAFETY: big outlives its completion, read below.
    unsafe { ep.send(&big, me, 77).unwrap() };
    let t0 = Instant::now();
    let mut entries = Vec::new();
    while recvd.read().unwrap() < 4 || entries.len() < 2 {
        let mut e = [CqTaggedEntry::default()];
        if cq.read(&mut e).is_ok() && e[0].flags & FI_RECV != 0 {
            entries.push(e[0]);
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "counter {} entries {entries:?}", recvd.read().unwrap());
    }
    assert_eq!(recvd.read().unwrap(), 4);
    let ctxs: Vec<(usize, usize)> = entries.iter().map(|e| (e.op_context, e.len)).collect();
    assert_eq!(ctxs, vec![(11, 2), (13, 200_000)], "only the receives that asked have entries");
    assert_eq!(&bufs[0][..1], b"a");
    assert_eq!(&bufs[2][..3], b"ccc");
    assert!(bufs[3] == big);
    drop(ep);
}

#[test]
fn bad_arguments_get_clear_errors() {
    job("args");
    let p = pair_with(CqFormat::Tagged, false);
    let big = vec![0u8; 5000];
    assert_eq!(p.ep0.inject(&big, p.a1).unwrap_err().kind(), ErrorKind::MsgSize);
    assert_eq!(p.ep0.inject(b"x", 12345).unwrap_err().kind(), ErrorKind::AddrNotAvail);
    let s = [std::io::IoSlice::new(b"a"); 5];
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        assert_eq!(p.ep0.sendv(&s, p.a1, 0).unwrap_err().kind(), ErrorKind::Inval);
        let iov = [std::io::IoSlice::new(b"a")];
        let m = SendMsg { iov: &iov, dest: p.a1, context: 0, data: 0, tag: 0 };
        assert_eq!(p.ep0.sendmsg(&m, FI_MULTI_RECV).unwrap_err().kind(), ErrorKind::BadFlags);
        let mut b = [0u8; 8];
        let mut iov = [std::io::IoSliceMut::new(&mut b)];
        let mut m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 0, tag: 0, ignore: 0 };
        assert_eq!(p.ep0.trecvmsg(&mut m, FI_MULTI_RECV).unwrap_err().kind(), ErrorKind::Inval);
        assert_eq!(p.ep0.recv(&mut b, 777, 0).unwrap_err().kind(), ErrorKind::AddrNotAvail);
    }
    assert_eq!(p.av.lookup(999).unwrap_err().kind(), ErrorKind::NoEnt);
    assert_eq!(p.av.insert_bytes(&[1, 2, 3]).unwrap_err().kind(), ErrorKind::Inval);
    // Not enabled yet / no AV.
    let ep = p.dom.endpoint().unwrap();
    assert_eq!(ep.inject(b"x", p.a1).unwrap_err().kind(), ErrorKind::Inval);
    assert_eq!(ep.enable().unwrap_err().kind(), ErrorKind::NoData);
    assert_eq!(p.ep0.bind_cq(&p.cq1, FI_TRANSMIT).unwrap_err().kind(), ErrorKind::Inval, "bind after enable");
    assert_eq!(ep.bind_cq(&p.cq1, 0).unwrap_err().kind(), ErrorKind::BadFlags);
    // A closed peer endpoint is not reachable.
    let gone = ep.getname();
    drop(ep);
    let g = p.av.insert(&[gone]).unwrap()[0];
    let e = p.ep0.inject(b"x", g).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AddrNotAvail, "{e}");
    assert!(e.to_string().contains("closed"), "{e}");
}

#[test]
fn a_peer_of_another_layout_version_is_refused_naming_both() {
    job("layout");
    let fabric = Fabric::open().unwrap();
    let other = fabric.domain().unwrap();
    let target = other.endpoint().unwrap();
    let p = pair_with(CqFormat::Tagged, false);
    let t = p.av.insert(&[target.getname()]).unwrap()[0];
    // Make the target's region look as if another build made it.
    let id = shmfab::internal::region::RegionId::of(&target.getname());
    let r = shmfab::internal::region::Region::attach(&id).unwrap();
    let hdr = r.base() as *mut shm_layout::RegionHeader;
    // SAFETY: a mapped header; only this test touches the field.
    unsafe { std::ptr::addr_of_mut!((*hdr).layout_version).write(shm_layout::LAYOUT_VERSION + 1) };
    let e = p.ep0.inject(b"x", t).unwrap_err();
    let s = e.to_string();
    assert_eq!(e.kind(), ErrorKind::OpNotSupp, "{s}");
    assert!(s.contains(&format!("layout version {}", shm_layout::LAYOUT_VERSION + 1)), "{s}");
    assert!(s.contains(&format!("layout version {}", shm_layout::LAYOUT_VERSION)), "{s}");
    // SAFETY: as above: restoring the field this test changed.
    unsafe { std::ptr::addr_of_mut!((*hdr).layout_version).write(shm_layout::LAYOUT_VERSION) };
    drop(target);
}

/// A child of this binary that makes a domain (regions kept as `mode`
/// says), writes its region's name to a file, and waits to be killed; its
/// job id and region name.
fn spawn_region_owner(test: &str, mode: &str) -> (std::process::Child, String, String) {
    let jobid = format!("objects-kill-{mode}-{}", std::process::id());
    let note = std::env::temp_dir().join(format!("{jobid}.name"));
    let _ = std::fs::remove_file(&note);
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "-q"])
        .env("SHMFAB_TEST_KILLME", &note)
        .env("SHMFAB_JOB_ID", &jobid)
        .env("SHMFAB_REGIONS", mode)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let name = loop {
        if let Ok(n) = std::fs::read_to_string(&note) {
            if !n.is_empty() {
                break n;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "child never made its region");
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = std::fs::remove_file(&note);
    (child, jobid, name)
}

/// In a child of `spawn_region_owner`: make the region, say its name, wait.
fn region_owner_child() {
    if let Ok(path) = std::env::var("SHMFAB_TEST_KILLME") {
        let dom = Fabric::open().unwrap().domain().unwrap();
        let _ep = dom.endpoint().unwrap();
        std::fs::write(&path, dom.region_name()).unwrap();
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(0);
    }
}

#[test]
fn a_named_region_of_a_sigkilled_owner_is_removed_by_the_next_start() {
    region_owner_child();
    // Another test of this binary opening a domain in parallel cleans
    // dead regions too, and may remove ours between the dry run and the
    // look at the file. So a try whose region is gone before the dry
    // run's checks are done proves nothing either way and is tried
    // again; a dry run that removed what it lists would fail every try.
    const TRIES: usize = 4;
    for attempt in 1..=TRIES {
        let (mut child, jobid, name) =
            spawn_region_owner("a_named_region_of_a_sigkilled_owner_is_removed_by_the_next_start", "named");
        std::env::set_var("SHMFAB_JOB_ID", &jobid);
        let path = format!("/dev/shm/{name}");
        // A live owner's region is left alone.
        let named = shmfab::Config { regions: shmfab::internal::region::Backing::Named, ..shmfab::Config::default() };
        let keep = Fabric::with_config(named).unwrap().domain().unwrap();
        assert!(std::path::Path::new(&path).exists(), "live owner's region must survive a start");
        child.kill().unwrap();
        child.wait().unwrap();
        let dead = shmfab::internal::region::clean_dead(true);
        let listed = dead.iter().any(|r| r.name == name);
        let still = std::path::Path::new(&path).exists();
        if !(listed && still) {
            assert!(!still, "a dead owner's region that exists is listed by the dry run");
            assert!(attempt < TRIES, "{TRIES} tries, each region gone before the dry run's checks: it removes them");
            continue; // removed by a parallel start: try again
        }
        let _next = Fabric::open().unwrap().domain().unwrap();
        assert!(!std::path::Path::new(&path).exists(), "the next start removed the dead owner's region");
        assert!(std::path::Path::new(&format!("/dev/shm/{}", keep.region_name())).exists());
        return;
    }
}

#[test]
fn an_anonymous_region_of_a_sigkilled_owner_is_gone_with_it() {
    region_owner_child();
    let (mut child, jobid, name) =
        spawn_region_owner("an_anonymous_region_of_a_sigkilled_owner_is_gone_with_it", "anonymous");
    let jh = shmfab::internal::region::job_hash(&jobid);
    // No file, but found (alive) through the owner's descriptors.
    assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    let found = shmfab::internal::region::scan(Some(jh));
    assert!(found.len() == 1 && found[0].alive && !found[0].named && found[0].name == name, "{found:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    // Gone with its owner: no start, no clean.
    assert!(shmfab::internal::region::scan(Some(jh)).is_empty());
    assert!(shmfab::internal::region::clean_dead(true).iter().all(|r| r.job != jh));
}

/// FI_INJECT on the msg calls (fi_msg(3)): the buffer may be reused as soon
/// as the call returns, also when the send has to queue behind an earlier
/// one (tagged and untagged); above the inject size it is refused; and the
/// send completes as any send does (an entry on a non-selective CQ, and on
/// a selective one with FI_COMPLETION), unlike the inject calls.
#[test]
fn sendmsg_with_fi_inject() {
    job("msg-inject");
    let p = pair_with(CqFormat::Tagged, false);
    let big = vec![7u8; 1 << 20];
    let mut rbig = vec![0u8; 1 << 20];
    let (mut r0, mut r1) = ([0u8; 8], [0u8; 8]);
    // SAFETY: every buffer outlives the completions read below.
    unsafe {
        // A rendezvous first: the injects below queue behind it.
        p.ep0.tsend(&big, p.a1, 1, 10).unwrap();
        let mut b = *b"original";
        let iov = [std::io::IoSlice::new(&b)];
        p.ep0.tsendmsg(&SendMsg { iov: &iov, dest: p.a1, context: 11, data: 0, tag: 2 }, FI_INJECT).unwrap();
        b.copy_from_slice(b"XXXXXXXX");
        let iov = [std::io::IoSlice::new(&b)];
        p.ep0.sendmsg(&SendMsg { iov: &iov, dest: p.a1, context: 12, data: 0, tag: 0 }, FI_INJECT).unwrap();
        b.copy_from_slice(b"YYYYYYYY");
        let _ = &b;
        // Too large for FI_INJECT.
        let too_big = vec![0u8; shmfab::proto::INJECT_SIZE + 1];
        let iov = [std::io::IoSlice::new(&too_big)];
        let e = p.ep0.sendmsg(&SendMsg { iov: &iov, dest: p.a1, context: 13, data: 0, tag: 0 }, FI_INJECT);
        assert_eq!(e.unwrap_err().kind(), ErrorKind::MsgSize);
        let e = p.ep0.tsendmsg(&SendMsg { iov: &iov, dest: p.a1, context: 13, data: 0, tag: 0 }, FI_INJECT);
        assert_eq!(e.unwrap_err().kind(), ErrorKind::MsgSize);
        p.ep1.trecv(&mut rbig, p.a0, 1, 0, 20).unwrap();
        p.ep1.trecv(&mut r0, p.a0, 2, 0, 21).unwrap();
        p.ep1.recv(&mut r1, p.a0, 22).unwrap();
    }
    let mut rx = Vec::new();
    let mut tx = Vec::new();
    let t0 = Instant::now();
    while (rx.len() < 3 || tx.len() < 3) && t0.elapsed() < Duration::from_secs(10) {
        let mut e = [CqTaggedEntry::default()];
        if p.cq0.read(&mut e).is_ok() {
            tx.push(e[0].op_context);
        }
        if p.cq1.read(&mut e).is_ok() {
            rx.push(e[0].op_context);
        }
    }
    rx.sort();
    tx.sort();
    assert_eq!(rx, vec![20, 21, 22]);
    assert_eq!(tx, vec![10, 11, 12], "a send with FI_INJECT still completes (non-selective CQ)");
    assert_eq!(&r0, b"original", "tsendmsg with FI_INJECT: the bytes at the call, not the reused buffer's");
    assert_eq!(&r1, b"XXXXXXXX", "sendmsg with FI_INJECT: the bytes at the call");
    assert!(rbig.iter().all(|&x| x == 7));

    // Selective CQ: FI_INJECT | FI_COMPLETION writes its entry; FI_INJECT
    // alone does not; the inject call never does.
    job("msg-inject-sel");
    let p = pair_with(CqFormat::Tagged, true);
    let mut r = [[0u8; 4]; 3];
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        for (i, b) in r.iter_mut().enumerate() {
            p.ep1.recv(b, p.a0, 30 + i).unwrap();
        }
        let iov = [std::io::IoSlice::new(b"abcd")];
        p.ep0
            .sendmsg(&SendMsg { iov: &iov, dest: p.a1, context: 40, data: 0, tag: 0 }, FI_INJECT | FI_COMPLETION)
            .unwrap();
        p.ep0.sendmsg(&SendMsg { iov: &iov, dest: p.a1, context: 41, data: 0, tag: 0 }, FI_INJECT).unwrap();
    }
    p.ep0.inject(b"efgh", p.a1).unwrap();
    let mut tx = Vec::new();
    let mut rx = 0;
    let t0 = Instant::now();
    while (rx < 3 || tx.is_empty()) && t0.elapsed() < Duration::from_secs(10) {
        let mut e = [CqTaggedEntry::default()];
        if p.cq0.read(&mut e).is_ok() {
            tx.push(e[0].op_context);
        }
        if p.cq1.read(&mut e).is_ok() {
            rx += 1;
        }
    }
    // A little longer, to see that no other entry comes.
    for _ in 0..1000 {
        let mut e = [CqTaggedEntry::default()];
        if p.cq0.read(&mut e).is_ok() {
            tx.push(e[0].op_context);
        }
    }
    assert_eq!(tx, vec![40], "only the FI_INJECT send that asked for its completion");
    assert_eq!(rx, 3);
}

/// fi_cancel of posted receives: the receive completes as an FI_ECANCELED
/// error entry (once), the others still take messages; and closing an
/// endpoint flushes its posted receives the same way, so every buffer is
/// reported free.
#[test]
fn posted_receives_are_cancelled_and_flushed() {
    job("cancel");
    let p = pair_with(CqFormat::Tagged, false);
    let recv_errs = p.dom.cntr_open().unwrap();
    let (mut b1, mut b2, mut b3, mut t1) = ([0u8; 8], [0u8; 8], [0u8; 8], [0u8; 8]);
    // SAFETY: the buffers outlive the completions read below.
    unsafe {
        p.ep1.recv(&mut b1, FI_ADDR_UNSPEC, 1).unwrap();
        p.ep1.recv(&mut b2, FI_ADDR_UNSPEC, 2).unwrap();
        p.ep1.recv(&mut b3, FI_ADDR_UNSPEC, 3).unwrap();
        p.ep1.trecv(&mut t1, FI_ADDR_UNSPEC, 9, 0, 4).unwrap();
    }
    assert!(p.ep1.cancel(2).unwrap());
    assert!(!p.ep1.cancel(2).unwrap(), "cancelled once");
    assert!(!p.ep1.cancel(99).unwrap(), "no such receive");
    assert!(p.ep1.cancel(4).unwrap(), "tagged receives too");
    // Two error entries, in cancel order.
    assert_eq!(read_one::<CqTaggedEntry>(&p.cq1).unwrap_err().kind(), ErrorKind::Avail);
    let e = p.cq1.readerr().unwrap();
    assert_eq!((e.op_context, e.err, e.flags), (2, ErrorKind::Canceled.errno(), FI_RECV | FI_MSG));
    assert_eq!(e.buf, b2.as_ptr() as usize);
    let e = p.cq1.readerr().unwrap();
    assert_eq!((e.op_context, e.err, e.flags), (4, ErrorKind::Canceled.errno(), FI_RECV | FI_TAGGED));
    // The others take the messages.
    p.ep0.inject(b"first", p.a1).unwrap();
    p.ep0.inject(b"second", p.a1).unwrap();
    let a = read_one::<CqTaggedEntry>(&p.cq1).unwrap();
    let b = read_one::<CqTaggedEntry>(&p.cq1).unwrap();
    assert_eq!((a.op_context, b.op_context), (1, 3));
    assert_eq!((&b1[..5], &b3[..6]), (&b"first"[..], &b"second"[..]));
    assert!(!p.ep1.cancel(1).unwrap(), "a completed receive is not cancelled");

    // Close flushes what is still posted: FI_ECANCELED, in posting order,
    // counted on the receive counter's error value.
    let ep = p.dom.endpoint().unwrap();
    ep.bind_cq(&p.cq1, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&p.av).unwrap();
    ep.bind_cntr(&recv_errs, FI_RECV).unwrap();
    ep.enable().unwrap();
    let (mut c1, mut c2) = ([0u8; 8], [0u8; 64]);
    // SAFETY: the buffers outlive the flush below (the close).
    unsafe {
        ep.recv(&mut c1, FI_ADDR_UNSPEC, 11).unwrap();
        ep.trecvmsg(
            &mut RecvMsg {
                iov: &mut [std::io::IoSliceMut::new(&mut c2)],
                src: FI_ADDR_UNSPEC,
                context: 12,
                tag: 5,
                ignore: 0,
            },
            0,
        )
        .unwrap();
    }
    ep.close().unwrap();
    let e = p.cq1.readerr().unwrap();
    assert_eq!((e.op_context, e.err), (11, ErrorKind::Canceled.errno()));
    let e = p.cq1.readerr().unwrap();
    assert_eq!((e.op_context, e.err, e.flags & FI_TAGGED), (12, ErrorKind::Canceled.errno(), FI_TAGGED));
    assert_eq!(p.cq1.readerr().unwrap_err().kind(), ErrorKind::Again, "each flushed once");
    assert_eq!(recv_errs.readerr().unwrap(), 2);
}

/// A domain opens an endpoint per peer for a few dozen peers with the
/// default settings (the default was 4 endpoints); past the limit the error
/// names SHMFAB_MAX_EPS.
#[test]
fn many_endpoints_per_domain_by_default() {
    job("many-eps");
    let f = Fabric::open().unwrap();
    let dom = f.domain().unwrap();
    let n = f.config().max_eps as usize;
    assert!(n >= 64, "default {n}");
    let eps: Vec<Endpoint> = (0..n).map(|_| dom.endpoint().unwrap()).collect();
    let Err(e) = dom.endpoint() else { panic!("endpoint {} opened past the limit", n + 1) };
    assert_eq!(e.kind(), ErrorKind::NoSpc);
    assert!(e.to_string().contains("SHMFAB_MAX_EPS"), "{e}");
    drop(eps);
    dom.endpoint().unwrap();
}

/// FI_WAIT_SET names its set: a CQ opened with WaitObj::Set and no set is
/// refused; one opened through a wait set waits through it (its own sread
/// refused); members can be removed from a wait set, and a CQ the set lets
/// go, or whose set is dropped, waits on its own again.
#[test]
fn wait_set_members_are_named_removed_and_recover() {
    job("waitset-members");
    let dom = Fabric::open().unwrap().domain().unwrap();
    let Err(e) = dom.cq_open(&CqAttr { wait_obj: WaitObj::Set, ..Default::default() }) else {
        panic!("a CQ with WaitObj::Set and no set was opened");
    };
    assert_eq!(e.kind(), ErrorKind::Inval, "{e}");
    let ws = dom.wait_open().unwrap();
    let cq = ws.cq_open(&CqAttr { wait_obj: WaitObj::Set, ..Default::default() }).unwrap();
    let c = dom.cntr_open().unwrap();
    ws.add_cntr(&c).unwrap();
    assert_eq!(cq.wait_obj().unwrap(), WaitObj::Set);
    let mut e = [CqTaggedEntry::default()];
    assert_eq!(
        cq.sread(&mut e, None, Some(Duration::ZERO)).unwrap_err().kind(),
        ErrorKind::Inval,
        "waits through the set"
    );
    assert_eq!(cq.close().unwrap_err().kind(), ErrorKind::Busy, "a member is bound");
    // Removed: it waits on its own (sread times out instead of being refused).
    ws.del_cq(&cq).unwrap();
    assert_eq!(ws.del_cq(&cq).unwrap_err().kind(), ErrorKind::NoEnt);
    assert_eq!(cq.wait_obj().unwrap(), WaitObj::Unspec);
    assert_eq!(cq.sread(&mut e, None, Some(Duration::ZERO)).unwrap_err().kind(), ErrorKind::Again);
    ws.del_cntr(&c).unwrap();
    ws.close().unwrap();
    // A set dropped with a member: the member recovers and can close.
    let ws = dom.wait_open().unwrap();
    ws.add_cq(&cq).unwrap();
    assert_eq!(cq.wait_obj().unwrap(), WaitObj::Set);
    drop(ws);
    assert_eq!(cq.wait_obj().unwrap(), WaitObj::Unspec);
    cq.close().unwrap();
    c.close().unwrap();
}

/// Counters take a wait object (fi_cntr_attr's wait_obj, FI_GETWAIT):
/// an Fd counter's fd, after trywait, becomes readable when another thread
/// adds to it; None refuses `wait`; the CQ-only objects are refused.
#[test]
fn counter_wait_objects() {
    job("cntr-wait-obj");
    let dom = Fabric::open().unwrap().domain_with(shmfab::Threading::Safe).unwrap();
    for w in [WaitObj::MutexCond, WaitObj::PollFd] {
        let Err(e) = dom.cntr_open_with(&CntrAttr { wait_obj: w }) else { panic!("{w:?} accepted") };
        assert_eq!(e.kind(), ErrorKind::NoSys);
    }
    // FI_WAIT_SET names its set at open.
    let Err(e) = dom.cntr_open_with(&CntrAttr { wait_obj: WaitObj::Set }) else { panic!("Set with no set") };
    assert_eq!(e.kind(), ErrorKind::Inval);
    let ws = dom.wait_open().unwrap();
    let member = ws.cntr_open().unwrap();
    assert_eq!(member.close().unwrap_err().kind(), ErrorKind::Busy, "bound to its set");
    ws.del_cntr(&member).unwrap();
    member.close().unwrap();
    let none = dom.cntr_open_with(&CntrAttr { wait_obj: WaitObj::None }).unwrap();
    assert_eq!(none.wait(1, Some(Duration::ZERO)).unwrap_err().kind(), ErrorKind::Inval);
    assert_eq!(none.wait_fd().unwrap_err().kind(), ErrorKind::NoSys);
    let c = dom.cntr_open_with(&CntrAttr { wait_obj: WaitObj::Fd }).unwrap();
    assert_eq!(c.wait_obj().unwrap(), WaitObj::Fd);
    let fd = c.wait_fd().unwrap();
    let poll = |ms: i32| {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the call.
        unsafe { libc::poll(&mut p, 1, ms) }
    };
    for round in 0..3u64 {
        // Nothing moved since the last trywait: Ok, the fd not readable.
        let mut tries = 0;
        while dom.trywait_with(&[], &[&c], &[]).is_err() {
            tries += 1;
            assert!(tries < 10, "round {round}: trywait keeps finding a change");
        }
        assert_eq!(poll(0), 0, "round {round}: nothing yet");
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                c.add(1).unwrap();
            });
            assert_eq!(poll(5000), 1, "round {round}: the add made the fd readable");
        });
        assert_eq!(c.read().unwrap(), round + 1);
    }
    c.close().unwrap();
}

/// A wait set chooses its wait object and gives it out (FI_GETWAIT): an Fd
/// set's fd goes into epoll, and becomes readable (after trywait) when a
/// member counter changes in another thread or a member CQ gets an entry.
#[test]
fn fd_wait_set_goes_into_epoll() {
    job("waitset-fd");
    let p = pair_with(CqFormat::Tagged, false);
    for w in [WaitObj::None, WaitObj::Set, WaitObj::MutexCond, WaitObj::PollFd] {
        assert_eq!(p.dom.wait_open_with(w).err().map(|e| e.kind()), Some(ErrorKind::NoSys), "{w:?}");
    }
    assert_eq!(p.dom.wait_open().unwrap().wait_fd().unwrap_err().kind(), ErrorKind::NoSys);
    let ws = p.dom.wait_open_with(WaitObj::Fd).unwrap();
    assert_eq!(ws.wait_obj(), WaitObj::Fd);
    let c = p.dom.cntr_open().unwrap();
    ws.add_cntr(&c).unwrap();
    ws.add_cq(&p.cq1).unwrap();
    // SAFETY: epoll_create1 has no memory arguments.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0);
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: 7 };
    // SAFETY: ev is valid for the call; the fd is the set's, open.
    assert_eq!(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, ws.wait_fd().unwrap(), &mut ev) }, 0);
    let wait = |ms: i32| {
        let mut out = [libc::epoll_event { events: 0, u64: 0 }];
        // SAFETY: out is valid for one event.
        unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 1, ms) }
    };
    let ready = |ws: &WaitSet| {
        let mut tries = 0;
        while p.dom.trywait_with(&[], &[], &[ws]).is_err() {
            // Take what is there, then try again.
            let _ = ws.wait(Some(Duration::ZERO));
            let mut e = [CqTaggedEntry::default()];
            while p.cq1.read(&mut e).is_ok() {}
            tries += 1;
            assert!(tries < 100, "trywait keeps finding an event");
        }
    };
    // A counter changed by another thread.
    ready(&ws);
    assert_eq!(wait(0), 0, "nothing yet");
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            c.add(1).unwrap();
        });
        assert_eq!(wait(5000), 1, "the counter's change made the set's fd readable");
    });
    // A message for a member CQ.
    ready(&ws);
    assert_eq!(wait(0), 0, "nothing yet");
    let mut b = [0u8; 8];
    // SAFETY: b outlives the completion read below.
    unsafe { p.ep1.recv(&mut b, FI_ADDR_UNSPEC, 9).unwrap() };
    p.ep0.inject(b"wake", p.a1).unwrap();
    assert_eq!(wait(5000), 1, "the message made the set's fd readable");
    assert_eq!(read_one::<CqTaggedEntry>(&p.cq1).unwrap().op_context, 9);
    // SAFETY: ep is our epoll fd.
    unsafe { libc::close(ep) };
    ws.del_cq(&p.cq1).unwrap();
    ws.del_cntr(&c).unwrap();
}

/// A peer whose region says it runs in another PID namespace (named
/// regions across containers): its pid names nothing here, or another
/// process, so a large message from it travels through the pool, never by
/// single copy from that pid.
#[test]
fn no_single_copy_with_a_peer_in_another_pid_namespace() {
    job("pidns-cma");
    let fabric = Fabric::open().unwrap();
    let (da, db) = (fabric.domain().unwrap(), fabric.domain().unwrap());
    let (cqa, cqb) = (da.cq_open(&CqAttr::default()).unwrap(), db.cq_open(&CqAttr::default()).unwrap());
    let (ava, avb) = (da.av_open().unwrap(), db.av_open().unwrap());
    let (a, b) = (da.endpoint().unwrap(), db.endpoint().unwrap());
    for (e, c, v) in [(&a, &cqa, &ava), (&b, &cqb, &avb)] {
        e.bind_cq(c, FI_TRANSMIT | FI_RECV).unwrap();
        e.bind_av(v).unwrap();
        e.enable().unwrap();
    }
    // The sender's region claims another namespace.
    let id = shmfab::internal::region::RegionId::of(&a.getname());
    let r = shmfab::internal::region::Region::attach(&id).unwrap();
    let hdr = r.base() as *mut shm_layout::RegionHeader;
    // SAFETY: a mapped header; only this test touches the field.
    unsafe { std::ptr::addr_of_mut!((*hdr).pid_ns).write(0x5eed_0000_0001) };
    let tb = ava.insert(&[b.getname()]).unwrap()[0];
    let fa = avb.insert(&[a.getname()]).unwrap()[0];
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let mut got = vec![0u8; 1 << 20];
    // SAFETY: got and data outlive the completions read below.
    unsafe { b.trecv(&mut got, fa, 9, 0, 1).unwrap() };
    unsafe { a.tsend(&data, tb, 9, 2).unwrap() };
    let t0 = Instant::now();
    let (mut rx, mut tx) = (false, false);
    let mut e = [CqTaggedEntry::default()];
    while !(rx && tx) {
        assert!(t0.elapsed() < Duration::from_secs(20), "the message never arrived");
        rx |= cqb.read(&mut e).is_ok();
        tx |= cqa.read(&mut e).is_ok();
    }
    assert!(got == data, "the data arrived intact");
    let s = b.stats().unwrap();
    assert_eq!(s.cma_reads, 0, "single copy from a pid of another namespace: {s:?}");
    drop((a, b));
}

/// FI_THREAD_DOMAIN as libfabric defines it (`Fabric::domain_serialized`):
/// calls from any thread, one at a time, are served (a Threading::Domain
/// domain refuses the second thread); re-entry is still refused; and the
/// safe constructor refuses the mode.
#[test]
fn a_serialized_domain_takes_calls_from_any_thread_in_turn() {
    job("serialized");
    let fab = Fabric::open().unwrap();
    let e = fab.domain_with(shmfab::Threading::Serialized).err().expect("refused by the safe constructor");
    assert_eq!(e.kind(), ErrorKind::Inval);
    // SAFETY: every call below is ordered: this thread's calls, then the
    // spawned thread's (started after them and joined before the next).
    let dom = unsafe { fab.domain_serialized() }.unwrap();
    let cq = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let open = || {
        let ep = dom.endpoint().unwrap();
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
        ep
    };
    let (a, b) = (open(), open());
    let to_b = av.insert(&[b.getname()]).unwrap()[0];
    a.tinject(b"first", to_b, 1).unwrap();
    let (a, b, cq) = std::thread::scope(|s| {
        s.spawn(move || {
            // Another thread, in turn: it sends, receives and reads the CQ.
            a.tinject(b"second", to_b, 2).unwrap();
            let mut got = Vec::new();
            for tag in [1u64, 2] {
                let mut buf = [0u8; 8];
                // SAFETY: buf outlives the completion read just below.
                unsafe { b.trecv(&mut buf, FI_ADDR_UNSPEC, tag, 0, tag as usize).unwrap() };
                let mut e = [CqTaggedEntry::default(); 4];
                let t0 = std::time::Instant::now();
                loop {
                    match cq.read(&mut e) {
                        Ok(n) => {
                            if let Some(x) = e[..n].iter().find(|x| x.flags & FI_RECV != 0) {
                                got.push((x.tag, buf[..x.len].to_vec()));
                                break;
                            }
                        }
                        Err(x) if x.kind() == ErrorKind::Again => {}
                        Err(x) => panic!("{x}"),
                    }
                    assert!(t0.elapsed() < Duration::from_secs(10), "no completion");
                }
            }
            assert_eq!(got, vec![(1, b"first".to_vec()), (2, b"second".to_vec())]);
            (a, b, cq)
        })
        .join()
        .unwrap()
    });
    a.close().unwrap();
    b.close().unwrap();
    cq.close().unwrap();
}
