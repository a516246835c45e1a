//! Probes across real processes (fi_tagged(3) FI_PEEK, FI_CLAIM,
//! FI_DISCARD, what MPI_Probe, MPI_Improbe and MPI_Mrecv use): a peek that
//! finds nothing (-FI_ENOMSG) and one that finds a message (its length, tag,
//! data and source, the message left in place); peek and claim, then the
//! claim's receive, for inline, bounce and rendezvous sizes, the claimed
//! message invisible to later peeks and receives meanwhile; claim and
//! discard, peek and discard (the sender's send completes, the message is
//! gone); a claim's context used twice, or never claimed.

mod common;
use common::{pattern, run, World};
use shmfab::{
    CqErrEntry, CqTaggedEntry, ErrorKind, RecvMsg, FI_ADDR_UNSPEC, FI_CLAIM, FI_DISCARD, FI_PEEK, FI_RECV,
    FI_REMOTE_CQ_DATA, FI_TAGGED,
};
use std::io::IoSliceMut;
use std::time::{Duration, Instant};

/// Inline, bounce (several fragments) and rendezvous sizes.
const SIZES: [usize; 3] = [8, 30_000, 300_000];
const ENOMSG: i32 = 42;

/// A peek (or claim) with `flags` on `tag` under `ctx` into `buf`; its
/// completion.
fn probe(w: &World, buf: &mut [u8], tag: u64, flags: u64, ctx: usize) -> Result<CqTaggedEntry, CqErrEntry> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: ctx, tag, ignore: 0 };
    // SAFETY: the completion is waited for below, while buf lives.
    unsafe { w.ep.trecvmsg(&mut m, flags).unwrap() };
    let (e, src) = w.wait_ctx(ctx)?;
    assert_eq!(src, w.addrs[0], "the source of what a peek or claim found");
    Ok(e)
}

/// Peeks with `flags` until a message with `tag` is found (each miss is an
/// -FI_ENOMSG error completion); its completion.
fn peek_found(w: &World, tag: u64, flags: u64, ctx: usize) -> CqTaggedEntry {
    let t0 = Instant::now();
    loop {
        match probe(w, &mut [], tag, flags, ctx) {
            Ok(e) => return e,
            Err(e) => assert_eq!((e.err, e.op_context), (ENOMSG, ctx), "a miss is -FI_ENOMSG"),
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no message with tag {tag} found by peeks");
    }
}

/// The entry of a found message: length `len`, tag, data, source, no buffer.
fn check_found(e: &CqTaggedEntry, len: usize, tag: u64) {
    assert_eq!(e.flags, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA);
    assert_eq!((e.len, e.tag, e.data, e.buf), (len, tag, len as u64 + 7, 0), "peek entry");
}

fn no_message(w: &World, tag: u64, ctx: usize) {
    let e = probe(w, &mut [], tag, FI_PEEK, ctx).expect_err("nothing to find");
    assert_eq!((e.err, e.op_context, e.flags), (ENOMSG, ctx, FI_RECV | FI_TAGGED));
}

fn body(w: World) {
    let send = |k: usize, len: usize, tag: u64| {
        let data = pattern(len, k as u64);
        // SAFETY: data lives until the send's completion, waited for here.
        w.retry(|| unsafe { w.ep.tsenddata(&data, len as u64 + 7, w.addrs[1], tag, 5000 + k) });
        w.ok(5000 + k);
    };
    if w.rank == 0 {
        w.barrier();
        for (k, &len) in SIZES.iter().enumerate() {
            // Claimed, then a second one for the receive posted meanwhile.
            let tag = 100 + k as u64;
            let data = pattern(len, k as u64);
            // SAFETY: data lives until the send's completion below.
            w.retry(|| unsafe { w.ep.tsenddata(&data, len as u64 + 7, w.addrs[1], tag, 5000 + k) });
            w.barrier();
            w.ok(5000 + k);
            send(10 + k, len, tag);
            w.barrier();
        }
        // Claimed then discarded, and discarded by a peek: the sends
        // complete all the same.
        for (k, &len) in SIZES.iter().enumerate() {
            send(20 + k, len, 200 + k as u64);
            send(30 + k, len, 300 + k as u64);
        }
        send(40, 8, 400);
        w.barrier();
        return;
    }
    // Receiver.
    no_message(&w, 100, 1);
    w.barrier();
    for (k, &len) in SIZES.iter().enumerate() {
        let tag = 100 + k as u64;
        // Found, and left in place: found again, then claimed.
        let e = peek_found(&w, tag, FI_PEEK, 2);
        check_found(&e, len, tag);
        let e = probe(&w, &mut [], tag, FI_PEEK, 3).expect("still there");
        check_found(&e, len, tag);
        let claim_ctx = 4;
        let e = probe(&w, &mut [], tag, FI_PEEK | FI_CLAIM, claim_ctx).expect("claimed");
        check_found(&e, len, tag);
        // Claimed: no peek sees it, a receive posted now does not take it,
        // and the context cannot claim another.
        no_message(&w, tag, 5);
        let mut other = vec![0u8; len];
        // SAFETY: other lives until its completion, waited for below.
        unsafe { w.ep.trecv(&mut other, FI_ADDR_UNSPEC, tag, 0, 6).unwrap() };
        let mut m = RecvMsg { iov: &mut [], src: FI_ADDR_UNSPEC, context: claim_ctx, tag, ignore: 0 };
        // SAFETY: refused: nothing is posted.
        let err = unsafe { w.ep.trecvmsg(&mut m, FI_PEEK | FI_CLAIM) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Inval, "a context holds one claim");
        w.barrier();
        // The claim's receive gets it whole (a rendezvous read now).
        let mut buf = vec![0u8; len + 16];
        let e = probe(&w, &mut buf, 0, FI_CLAIM, claim_ctx).expect("claimed message received");
        assert_eq!((e.len, e.tag, e.data, e.flags & FI_RECV), (len, tag, len as u64 + 7, FI_RECV));
        assert!(buf[..len] == pattern(len, k as u64)[..], "claimed payload of {len} B");
        // Received once: the context holds no claim any more.
        let mut m = RecvMsg { iov: &mut [], src: FI_ADDR_UNSPEC, context: claim_ctx, tag, ignore: 0 };
        // SAFETY: refused: nothing is posted.
        let err = unsafe { w.ep.trecvmsg(&mut m, FI_CLAIM) }.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Inval, "a claim is received once");
        // The receive posted meanwhile takes the next message.
        let e = w.ok(6);
        assert_eq!(e.len, len);
        assert!(other == pattern(len, 10 + k as u64), "the later message went to the posted receive");
        w.barrier();
    }
    // Claim, then discard.
    for (k, &len) in SIZES.iter().enumerate() {
        let tag = 200 + k as u64;
        let e = peek_found(&w, tag, FI_PEEK | FI_CLAIM, 7);
        check_found(&e, len, tag);
        let e = probe(&w, &mut [], 0, FI_CLAIM | FI_DISCARD, 7).expect("discarded");
        assert_eq!((e.len, e.tag, e.flags), (0, tag, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA));
        no_message(&w, tag, 8);
    }
    // Peek and discard.
    for (k, &len) in SIZES.iter().enumerate() {
        let tag = 300 + k as u64;
        let e = peek_found(&w, tag, FI_PEEK | FI_DISCARD, 9);
        check_found(&e, len, tag);
        no_message(&w, tag, 10);
    }
    // The stream goes on after them.
    let mut b = [0u8; 8];
    // SAFETY: b lives until the completion below.
    unsafe { w.ep.trecv(&mut b, FI_ADDR_UNSPEC, 400, 0, 11).unwrap() };
    assert_eq!(w.ok(11).len, 8);
    // A context that never claimed, and flags that mean nothing.
    let mut m = RecvMsg { iov: &mut [], src: FI_ADDR_UNSPEC, context: 12, tag: 0, ignore: 0 };
    // SAFETY: refused: nothing is posted.
    assert_eq!(unsafe { w.ep.trecvmsg(&mut m, FI_CLAIM) }.unwrap_err().kind(), ErrorKind::Inval);
    // SAFETY: as above.
    assert_eq!(unsafe { w.ep.trecvmsg(&mut m, FI_DISCARD) }.unwrap_err().kind(), ErrorKind::BadFlags);
    // SAFETY: as above.
    assert_eq!(unsafe { w.ep.recvmsg(&mut m, FI_PEEK) }.unwrap_err().kind(), ErrorKind::BadFlags, "tagged only");
    w.barrier();
    assert_eq!(w.unclaimed(), 0);
}

#[test]
fn peek_claim_discard() {
    // Single copy from 64 KiB (the default is 8 KiB): 30,000 B goes
    // eagerly through the pool, whose send completes without the
    // receiver (the body sends the next message only then).
    run("peek_claim_discard", 2, &[("SHMFAB_CMA_MIN", "65536")], Duration::from_secs(120), body);
}

#[test]
fn peek_claim_discard_cma_off() {
    // Rendezvous data then comes through the pool after the claim.
    run("peek_claim_discard_cma_off", 2, &[("SHMFAB_CMA", "off")], Duration::from_secs(120), body);
}
