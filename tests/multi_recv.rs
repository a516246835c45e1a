//! FI_MULTI_RECV across peers (an endpoint's buffer and an SRQ's): the
//! completion with FI_MULTI_RECV is the last one that references its
//! buffer. A large message of peer A (a rendezvous, or an eager message
//! through a small pool) takes the first piece of the buffer and stays
//! incomplete (A makes no progress: it waits on a file) while peer B's
//! small messages carve the rest and release it, or the buffer is
//! cancelled, or A dies: the flag then waits for A's piece, reported last
//! (in success, or in error when A died or its piece was flushed by a
//! close of the endpoint that held it). And a buffer not released when
//! its endpoint closes: its outstanding piece is flushed first, its rest,
//! with the flag, last.

mod common;
use common::{pattern, put_file, run, run_killing, test_dir, World};
use shmfab::*;
use std::io::IoSliceMut;
use std::time::{Duration, Instant};

/// Bytes of A's message: a rendezvous with single copy off.
const BIG: usize = 131072;
/// B's messages: 4 of them fill the rest (64 bytes, released below 64).
const SMALL: usize = 64;
const N_SMALL: usize = 4;
/// The buffer: A's piece, then B's.
const BUF: usize = BIG + N_SMALL * SMALL;
/// Context of the multi-receive buffer.
const CTX: usize = 50;

/// How the buffer's last piece before A's ends.
#[derive(Clone, Copy, PartialEq)]
enum End {
    /// B's small messages carve the rest; the last releases the buffer.
    Small,
    /// The buffer is cancelled (what is left of it released).
    Cancel,
    /// B's messages release it, and A dies before its data is sent.
    Die,
    /// B's messages release it (an SRQ's: taken by the second endpoint),
    /// and the endpoint that holds A's piece closes, flushing it.
    Close,
    /// As `Close`, closing with `close_discard`: A's piece goes back to
    /// the SRQ, but the buffer stays released: its release is reported.
    Discard,
    /// No message of B: the endpoint closes with the buffer still posted
    /// (not released) and A's piece outstanding: A's piece is flushed
    /// first, without the flag, then the buffer's rest, with it.
    CloseUnreleased,
}

/// Waits (sleeping, with no progress) until the file `name` exists.
fn await_file(name: &str) {
    let p = test_dir().join(name);
    let t0 = Instant::now();
    while !p.exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "never got {name}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The receiver (rank 0): `post` posts the buffer (context [`CTX`]),
/// `cancel` cancels it, `close` closes the endpoint A sends to
/// (discarding or not); `cqs` are where its pieces complete; `eps` are
/// the addresses A (rank 1) and B (rank 2) send to.
fn receiver(
    w: &World,
    end: End,
    cqs: &[&CompletionQueue],
    eps: [Address; 2],
    post: &dyn Fn(&mut [u8]),
    cancel: &dyn Fn() -> bool,
    close: &dyn Fn(bool),
) {
    let mut buf = vec![0u8; BUF];
    let base = buf.as_ptr() as usize;
    w.tell(1, &[eps[0]]);
    w.tell(2, &[eps[1]]);
    post(&mut buf);
    w.barrier(); // the buffer is posted
                 // A's request is in our ring once it says so; a pass takes it (its
                 // data waits for A, which makes no progress until told).
    await_file("a_sent");
    for _ in 0..3 {
        w.dom.progress().unwrap();
    }
    for cq in cqs {
        let mut e = [CqTaggedEntry::default()];
        assert_eq!(cq.read(&mut e).unwrap_err().kind(), ErrorKind::Again, "A's message is not complete yet");
    }
    put_file("rts_taken", "");
    // Everything reported for the buffer, in order: (len, buf, flags, err).
    let mut seen: Vec<(usize, usize, u64, i32)> = Vec::new();
    let read = |seen: &mut Vec<(usize, usize, u64, i32)>| {
        let t0 = Instant::now();
        loop {
            for cq in cqs {
                match next_now(cq) {
                    Some(Ok(e)) => {
                        assert_eq!(e.op_context, CTX);
                        seen.push((e.len, e.buf, e.flags, 0));
                        return;
                    }
                    Some(Err(x)) => {
                        assert_eq!(x.op_context, CTX);
                        seen.push((x.len, x.buf, x.flags, x.err));
                        return;
                    }
                    None => {}
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(60), "no completion after {seen:?}");
            w.dom.wait(Some(Duration::from_millis(1)));
        }
    };
    let early = match end {
        End::Small | End::Die | End::Close | End::Discard => {
            await_file("b_sent");
            for _ in 0..N_SMALL {
                read(&mut seen);
            }
            N_SMALL
        }
        End::CloseUnreleased => {
            close(false);
            read(&mut seen);
            read(&mut seen);
            let canceled = ErrorKind::Canceled.errno();
            assert_eq!((seen[0].1, seen[0].2 & FI_MULTI_RECV, seen[0].3), (base, 0, canceled), "A's piece: {seen:?}");
            assert_eq!(
                (seen[1].1, seen[1].2 & FI_MULTI_RECV, seen[1].3),
                (base + BIG, FI_MULTI_RECV, canceled),
                "the rest of the buffer, released last: {seen:?}"
            );
            put_file("go_a", "");
            w.barrier();
            return;
        }
        End::Cancel => {
            assert!(cancel(), "the buffer is still posted");
            read(&mut seen);
            assert_eq!(seen[0].3, ErrorKind::Canceled.errno(), "the cancel's entry: {seen:?}");
            1
        }
    };
    assert!(
        seen.iter().all(|s| s.2 & FI_MULTI_RECV == 0),
        "FI_MULTI_RECV reported while A's piece is outstanding: {seen:?}"
    );
    // A sends its data now (or dies); or A's piece is flushed.
    match end {
        End::Close => close(false),
        End::Discard => close(true),
        _ => {}
    }
    put_file("go_a", "");
    // A's piece: the last, with the flag.
    read(&mut seen);
    let (len, at, flags, err) = seen[early];
    assert_eq!(at, base, "A's piece is the first of the buffer");
    assert_eq!(flags & FI_MULTI_RECV, FI_MULTI_RECV, "the last piece releases the buffer: {seen:?}");
    if end == End::Die {
        assert_eq!(err, ErrorKind::Io.errno(), "A died: its piece fails");
    } else if end == End::Close || end == End::Discard {
        assert_eq!(err, ErrorKind::Canceled.errno(), "A's piece flushed, or the release owed at a give-back");
    } else {
        assert_eq!((len, err), (BIG, 0));
        assert!(buf[..BIG] == pattern(BIG, 1)[..], "A's data");
    }
    if end != End::Cancel {
        for (k, s) in seen[..N_SMALL].iter().enumerate() {
            assert_eq!((s.0, s.1, s.3), (SMALL, base + BIG + k * SMALL, 0), "B's message {k}");
            assert!(buf[BIG + k * SMALL..][..SMALL] == pattern(SMALL, 10 + k as u64)[..]);
        }
    }
    // Nothing more references the buffer.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(50) {
        for cq in cqs {
            assert!(next_now(cq).is_none(), "a completion after the one with FI_MULTI_RECV");
        }
        w.dom.wait(Some(Duration::from_millis(1)));
    }
    if end != End::Die {
        w.barrier();
    }
}

/// A completion at `cq` if one is there now (a read drives progress).
fn next_now(cq: &CompletionQueue) -> Option<std::result::Result<CqTaggedEntry, CqErrEntry>> {
    let mut e = [CqTaggedEntry::default()];
    match cq.read(&mut e) {
        Ok(_) => Some(Ok(e[0])),
        Err(x) if x.kind() == ErrorKind::Avail => Some(Err(cq.readerr().unwrap())),
        Err(x) if x.kind() == ErrorKind::Again => None,
        Err(x) => panic!("cq read: {x}"),
    }
}

/// Ranks 1 (A) and 2 (B).
fn sender(w: &World, end: End) {
    let to = w.learn(0, 1)[0];
    w.barrier();
    if w.rank == 1 {
        let data = pattern(BIG, 1);
        // SAFETY: data outlives the send's completion (or this process).
        unsafe { w.ep.send(&data, to, 7).unwrap() };
        put_file("a_sent", "");
        await_file("go_a");
        if end == End::Die {
            // SAFETY: kill(2) of this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        if !matches!(end, End::Close | End::Discard | End::CloseUnreleased) {
            w.ok(7);
        }
    } else {
        await_file("rts_taken");
        if end != End::Cancel && end != End::CloseUnreleased {
            for k in 0..N_SMALL {
                w.retry(|| w.ep.inject(&pattern(SMALL, 10 + k as u64), to));
            }
            put_file("b_sent", "");
        }
    }
    if end != End::Die {
        w.barrier();
    }
}

/// The endpoint's own multi-receive buffer (an endpoint of its own, so
/// that it may close while the harness's endpoint still meets the others).
fn on_endpoint(w: World, end: End) {
    if w.rank != 0 {
        return sender(&w, end);
    }
    let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
    let ep = w.dom.endpoint().unwrap();
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
    ep.bind_av(&w.av).unwrap();
    ep.enable().unwrap();
    ep.set_min_multi_recv(SMALL).unwrap();
    let me = ep.getname();
    let post = |b: &mut [u8]| {
        // SAFETY: the buffer outlives every completion read by `receiver`.
        unsafe {
            let mut m =
                RecvMsg { iov: &mut [IoSliceMut::new(b)], src: FI_ADDR_UNSPEC, context: CTX, tag: 0, ignore: 0 };
            ep.recvmsg(&mut m, FI_MULTI_RECV).unwrap();
        }
    };
    let cancel = || ep.cancel(CTX).unwrap();
    let close = |discard: bool| {
        assert!(!discard, "a discarding close drops the endpoint's own receives unreported");
        ep.close().unwrap();
    };
    receiver(&w, end, &[&cq], [me, me], &post, &cancel, &close);
    drop(ep);
}

/// An SRQ's multi-receive buffer, A's piece taken by one endpoint, B's by
/// another, both reporting to one CQ.
fn on_srq(w: World, end: End) {
    if w.rank != 0 {
        return sender(&w, end);
    }
    let cq = w.dom.cq_open(&CqAttr::default()).unwrap();
    let srq = w.dom.srq_open(&SrqAttr::default()).unwrap();
    let eps: Vec<Endpoint> = common::srq_endpoints(&w, 2, &cq, &srq);
    srq.set_min_multi_recv(SMALL).unwrap();
    let post = |b: &mut [u8]| {
        // SAFETY: as in `on_endpoint`.
        unsafe {
            let mut m =
                RecvMsg { iov: &mut [IoSliceMut::new(b)], src: FI_ADDR_UNSPEC, context: CTX, tag: 0, ignore: 0 };
            srq.recvmsg(&mut m, FI_MULTI_RECV).unwrap();
        }
    };
    let cancel = || srq.cancel(CTX).unwrap();
    let close = |discard: bool| if discard { eps[0].close_discard().unwrap() } else { eps[0].close().unwrap() };
    receiver(&w, end, &[&cq], [eps[0].getname(), eps[1].getname()], &post, &cancel, &close);
    if end == End::Discard {
        assert_eq!(srq.query().unwrap().posted, 0, "A's piece is not posted again: the buffer was released");
    }
    drop(eps);
}

const T: Duration = Duration::from_secs(120);
const RNDV: &[(&str, &str)] = &[("SHMFAB_CMA", "off")];
/// A's message eager through the pool, 4 chunks of it at a time.
const POOL: &[(&str, &str)] = &[("SHMFAB_CMA", "off"), ("SHMFAB_RNDV_MIN", "1g"), ("SHMFAB_POOL_CHUNKS", "4")];

#[test]
fn multi_recv_flag_waits_for_a_rendezvous_piece() {
    run("multi_recv_flag_waits_for_a_rendezvous_piece", 3, RNDV, T, |w| on_endpoint(w, End::Small));
}

#[test]
fn multi_recv_flag_waits_for_a_pool_piece() {
    run("multi_recv_flag_waits_for_a_pool_piece", 3, POOL, T, |w| on_endpoint(w, End::Small));
}

#[test]
fn multi_recv_cancel_flag_waits_for_a_piece() {
    run("multi_recv_cancel_flag_waits_for_a_piece", 3, RNDV, T, |w| on_endpoint(w, End::Cancel));
}

#[test]
fn multi_recv_flag_goes_with_a_dead_peers_piece() {
    let env = &[("SHMFAB_CMA", "off"), ("SHMFAB_PEER_CHECK_MS", "20")];
    run_killing("multi_recv_flag_goes_with_a_dead_peers_piece", 3, env, T, &[1], |w| on_endpoint(w, End::Die));
}

#[test]
fn multi_recv_close_flushes_the_last_piece_with_the_flag() {
    run("multi_recv_close_flushes_the_last_piece_with_the_flag", 3, RNDV, T, |w| on_endpoint(w, End::Close));
}

#[test]
fn multi_recv_close_flushes_an_unreleased_buffer_after_its_pieces() {
    let name = "multi_recv_close_flushes_an_unreleased_buffer_after_its_pieces";
    run(name, 3, RNDV, T, |w| on_endpoint(w, End::CloseUnreleased));
}

#[test]
fn srq_multi_recv_flag_waits_for_a_rendezvous_piece() {
    run("srq_multi_recv_flag_waits_for_a_rendezvous_piece", 3, RNDV, T, |w| on_srq(w, End::Small));
}

#[test]
fn srq_multi_recv_flag_waits_for_a_pool_piece() {
    run("srq_multi_recv_flag_waits_for_a_pool_piece", 3, POOL, T, |w| on_srq(w, End::Small));
}

#[test]
fn srq_multi_recv_cancel_flag_waits_for_a_piece() {
    run("srq_multi_recv_cancel_flag_waits_for_a_piece", 3, RNDV, T, |w| on_srq(w, End::Cancel));
}

#[test]
fn srq_multi_recv_flag_goes_with_a_dead_peers_piece() {
    let env = &[("SHMFAB_CMA", "off"), ("SHMFAB_PEER_CHECK_MS", "20")];
    run_killing("srq_multi_recv_flag_goes_with_a_dead_peers_piece", 3, env, T, &[1], |w| on_srq(w, End::Die));
}

#[test]
fn srq_multi_recv_close_flushes_the_last_piece_with_the_flag() {
    run("srq_multi_recv_close_flushes_the_last_piece_with_the_flag", 3, RNDV, T, |w| on_srq(w, End::Close));
}

#[test]
fn srq_multi_recv_discarding_close_reports_the_owed_release() {
    run("srq_multi_recv_discarding_close_reports_the_owed_release", 3, RNDV, T, |w| on_srq(w, End::Discard));
}
