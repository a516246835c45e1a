//! Piped inline messages across real processes (`SHMFAB_PIPE_MIN`: an
//! inline message published before its payload, which the receiver copies
//! piece by piece while the sender writes it). Every byte arrives, in
//! order, at the sizes around the pipe's bounds and pieces, from one to
//! four send segments into one to four receive segments cut anywhere;
//! whether the receive was posted first (copied as it lands) or later
//! (taken whole); with remote CQ data and tags; truncated where the
//! receive is short. The receiver's counters say the path was taken.

mod common;
use common::{pattern, run};
use shmfab::{ErrorKind, RecvMsg, SendMsg, FI_COMPLETION, FI_REMOTE_CQ_DATA};
use std::io::{IoSlice, IoSliceMut};
use std::time::Duration;

/// Message lengths: around the default pipe threshold (8192), a piece
/// (4096) past it, and the largest inline message (16384).
const LENS: [usize; 9] = [8191, 8192, 8193, 12287, 12288, 12289, 15000, 16383, 16384];
const GO: u64 = 1 << 40;

/// Cuts `len` into `k` segments at uneven places.
fn cuts(len: usize, k: usize, seed: usize) -> Vec<usize> {
    let mut at: Vec<usize> = (1..k).map(|i| (len * i / k + seed * 97 + i * 31) % (len + 1)).collect();
    at.sort_unstable();
    at.dedup();
    let mut out = Vec::new();
    let mut prev = 0;
    for a in at.into_iter().chain([len]) {
        out.push(a - prev);
        prev = a;
    }
    out
}

/// Rank 0 sends every length of [`LENS`] with 1-4 segments, tagged, with
/// remote CQ data; rank 1 receives each into 1-4 segments. Round 0: rank
/// 1 posts everything first (each message copied as it lands); round 1:
/// rank 1 posts after rank 0 has sent (taken whole, from the ring or
/// unexpected).
fn every_length_and_segmentation(name: &str, env: &[(&str, &str)]) {
    let streams = !env.contains(&NO_STREAMS);
    run(name, 2, env, Duration::from_secs(120), |w| {
        let peer = w.addrs[1 - w.rank];
        let n = LENS.len() * 4;
        for round in 0..2u64 {
            if w.rank == 0 {
                if round == 0 {
                    // Rank 1 has posted its receives.
                    let mut go = [0u8; 1];
                    // SAFETY: go outlives the completion waited for below.
                    unsafe { w.ep.trecv(&mut go, peer, GO, 0, 1).unwrap() };
                    w.ok(1);
                }
                let msgs: Vec<Vec<u8>> = (0..n).map(|i| pattern(LENS[i / 4], 1000 * round + i as u64)).collect();
                for (i, m) in msgs.iter().enumerate() {
                    let parts = cuts(m.len(), 1 + i % 4, i);
                    let mut iov = Vec::new();
                    let mut at = 0;
                    for p in parts {
                        iov.push(IoSlice::new(&m[at..at + p]));
                        at += p;
                    }
                    let sm = SendMsg { iov: &iov, dest: peer, context: 100 + i, data: i as u64 + 7, tag: i as u64 };
                    // SAFETY: msgs outlives every completion waited for below.
                    w.retry(|| unsafe { w.ep.tsendmsg(&sm, FI_REMOTE_CQ_DATA | FI_COMPLETION) });
                }
                for i in 0..n {
                    w.ok(100 + i);
                }
                if round == 1 {
                    w.retry(|| w.ep.tinject(b"g", peer, GO));
                }
                w.barrier();
            } else {
                let mut bufs: Vec<Vec<u8>> = (0..n).map(|i| vec![0u8; LENS[i / 4]]).collect();
                let post = |bufs: &mut Vec<Vec<u8>>| {
                    for (i, b) in bufs.iter_mut().enumerate() {
                        let parts = cuts(b.len(), 1 + (i + 1) % 4, i + 5);
                        let mut rest: &mut [u8] = b;
                        let mut iov = Vec::new();
                        for p in parts {
                            let (a, r) = rest.split_at_mut(p);
                            iov.push(IoSliceMut::new(a));
                            rest = r;
                        }
                        let mut m = RecvMsg { iov: &mut iov, src: peer, context: 200 + i, tag: i as u64, ignore: 0 };
                        // SAFETY: bufs outlives every completion waited for below.
                        unsafe { w.ep.trecvmsg(&mut m, FI_COMPLETION).unwrap() };
                    }
                };
                if round == 0 {
                    post(&mut bufs);
                    w.retry(|| w.ep.tinject(b"g", peer, GO));
                } else {
                    // Rank 0 sends first: wait for its word, then post.
                    let mut go = [0u8; 1];
                    // SAFETY: go outlives the completion waited for below.
                    unsafe { w.ep.trecv(&mut go, peer, GO, 0, 2).unwrap() };
                    w.ok(2);
                    post(&mut bufs);
                }
                for i in 0..n {
                    let e = w.ok(200 + i);
                    assert_eq!((e.len, e.tag, e.data), (LENS[i / 4], i as u64, i as u64 + 7), "message {i}");
                    assert!(
                        bufs[i] == pattern(LENS[i / 4], 1000 * round + i as u64),
                        "round {round} message {i}: bytes"
                    );
                }
                w.barrier();
            }
        }
        let s = w.ep.stats().unwrap();
        if w.rank == 1 {
            let min = w.dom.config().pipe_min;
            let piped = LENS.iter().filter(|&&l| min != 0 && l >= min).count() * 4;
            let want = 2 * piped as u64;
            if streams {
                // Most of a stream's messages take the pool.
                assert!(s.rx_piped < want, "{s:?}");
            } else {
                assert_eq!(s.rx_piped, want, "{s:?}");
            }
        } else if streams {
            assert!(s.tx_streamed > 0, "{s:?}");
        }
    });
}

/// Rank 0's sends are a stream (nothing answers them), which would take
/// the pool after the first (`SHMFAB_STREAM_MIN`, tests/streams.rs): off
/// here, so that every message goes through the ring's piped path.
const NO_STREAMS: (&str, &str) = ("SHMFAB_STREAM_MIN", "1099511627776");

/// Single copy from 64 KiB (the default is 8 KiB: from there a ping-pong's
/// messages go by rendezvous, for the receiver to pick single copy or the
/// pool, inline only in the runs after it picks the pool): every message
/// here inline, as these tests are of the ring's piped path, and sends
/// complete without the receiver (the bodies wait for them first).
const RING_SIZES: (&str, &str) = ("SHMFAB_CMA_MIN", "65536");

#[test]
fn piped_messages_carry_every_byte() {
    every_length_and_segmentation("piped_messages_carry_every_byte", &[NO_STREAMS, RING_SIZES]);
}

/// The same with the stream rule on (tests/streams.rs): most of rank 0's
/// messages through the pool, in segments, with remote CQ data, received
/// into segments posted first or late. (From the review of the rule.)
#[test]
fn streamed_messages_carry_every_byte() {
    every_length_and_segmentation("streamed_messages_carry_every_byte", &[RING_SIZES]);
}

#[test]
fn piped_messages_carry_every_byte_with_a_low_threshold() {
    // Every inline message of more than one cell piped, down to 33 bytes
    // (LENS are all inline: the default single-copy threshold is higher).
    every_length_and_segmentation(
        "piped_messages_carry_every_byte_with_a_low_threshold",
        &[("SHMFAB_PIPE_MIN", "33"), NO_STREAMS, RING_SIZES],
    );
}

#[test]
fn unpiped_messages_carry_every_byte() {
    every_length_and_segmentation(
        "unpiped_messages_carry_every_byte",
        &[("SHMFAB_PIPE_MIN", "0"), NO_STREAMS, RING_SIZES],
    );
}

/// A piped message into a shorter receive: the receive's bytes, nothing
/// past it, and a truncation error entry with the rest's length.
#[test]
fn piped_message_truncated_across_processes() {
    run("piped_message_truncated_across_processes", 2, &[RING_SIZES], Duration::from_secs(60), |w| {
        let peer = w.addrs[1 - w.rank];
        let m = pattern(16000, 42);
        if w.rank == 0 {
            w.barrier();
            let iov = [IoSlice::new(&m)];
            let sm = SendMsg { iov: &iov, dest: peer, context: 1, data: 0, tag: 3 };
            // SAFETY: m outlives the completion.
            w.retry(|| unsafe { w.ep.tsendmsg(&sm, FI_COMPLETION) });
            w.ok(1);
        } else {
            let mut b = vec![0xeeu8; 12000];
            // SAFETY: b outlives the completion.
            unsafe { w.ep.trecv(&mut b[..9000], peer, 3, 0, 5).unwrap() };
            w.barrier();
            let x = w.wait_ctx(5).expect_err("a truncated receive is an error entry");
            assert_eq!((x.len, x.olen, x.err), (9000, 7000, ErrorKind::Trunc.errno()));
            assert!(b[..9000] == m[..9000] && b[9000..].iter().all(|&v| v == 0xee));
            assert_eq!(w.ep.stats().unwrap().rx_piped, 1);
        }
        w.barrier();
    });
}

/// A ping-pong of messages above the inline limit (16 KiB) and within
/// `SHMFAB_ANSWER_MAX` (32 KiB): each answer goes inline, piped (the
/// first message, which answers nothing, through the pool); past 32 KiB,
/// the pool. Every byte arrives; the counters say which way each went.
#[test]
fn answers_go_inline_up_to_half_the_ring() {
    run("answers_go_inline_up_to_half_the_ring", 2, &[RING_SIZES], Duration::from_secs(60), |w| {
        const ROUNDS: u64 = 20;
        for (k, len) in [16385usize, 24576, 32768, 32769].into_iter().enumerate() {
            let (before, after) = common::ping_pong(&w, len, ROUNDS, k as u64 * 1000);
            let (inline, pool) = (after.tx_inline - before.tx_inline, after.tx_bounce - before.tx_bounce);
            // Rank 1 answers every time; rank 0's first message answers
            // nothing.
            let answers = if w.rank == 0 { ROUNDS - 1 } else { ROUNDS };
            if len <= 32768 {
                assert_eq!((inline, pool), (answers, ROUNDS - answers), "len {len}: {after:?}");
            } else {
                assert_eq!((inline, pool), (0, ROUNDS), "len {len}: {after:?}");
            }
            w.barrier();
        }
    });
}

/// A receiver whose ring is smaller than its sender's (SHMFAB_RING_CELLS
/// set differently in the two processes; two fabrics of one process
/// here): a message the sender would send inline but the receiver's ring
/// can never hold goes through the pool instead of waiting for room for
/// ever. (Found by review: a 32 KiB answer to a ring of 512 cells, and a
/// 16 KiB inline message to one of 256, hung with every send behind them.)
#[test]
fn inline_messages_too_big_for_the_receivers_ring_take_the_pool() {
    use shmfab::{CqTaggedEntry, Fabric};
    std::env::set_var("SHMFAB_JOB_ID", format!("piped-small-ring-{}", std::process::id()));
    let open = |cells: u32| {
        let mut cfg = shmfab::Config::default();
        cfg.geometry.ring_cells = cells;
        let dom = Fabric::with_config(cfg).unwrap().domain().unwrap();
        let (cq, av, ep) = common::open_endpoint(&dom);
        (dom, cq, av, ep)
    };
    let (bd, bcq, bav, big) = open(1024);
    for cells in [512u32, 256] {
        let (sd, scq, sav, small) = open(cells);
        let to = bav.insert(&[small.getname()]).unwrap()[0];
        let back = sav.insert(&[big.getname()]).unwrap()[0];
        let read = |dom: &shmfab::Domain, cq: &shmfab::CompletionQueue, other: &shmfab::Domain| {
            let t0 = std::time::Instant::now();
            let mut e = [CqTaggedEntry::default()];
            loop {
                match cq.read(&mut e) {
                    Ok(_) => return e[0],
                    Err(x) if x.kind() == ErrorKind::Again => {}
                    Err(x) => panic!("{x}"),
                }
                other.progress().unwrap();
                dom.progress().unwrap();
                assert!(t0.elapsed() < Duration::from_secs(10), "never completed ({cells}-cell receiver)");
            }
        };
        for len in [16384usize, 32768] {
            // A small message from the receiver first: the big-ring
            // sender's next one answers it.
            let mut b = [0u8; 8];
            // SAFETY: b outlives the completion read below.
            unsafe { big.trecv(&mut b, to, 1, 0, 1).unwrap() };
            small.tinject(b"hi", back, 1).unwrap();
            assert_eq!(read(&bd, &bcq, &sd).op_context, 1);
            let m = pattern(len, len as u64 + cells as u64);
            let mut r = vec![0u8; len];
            // SAFETY: r and m outlive the completions read below.
            unsafe {
                small.trecv(&mut r, back, 2, 0, 2).unwrap();
                big.tsend(&m, to, 2, 3).unwrap();
            }
            assert_eq!(read(&sd, &scq, &bd).op_context, 2);
            assert_eq!(read(&bd, &bcq, &sd).op_context, 3);
            assert!(r == m, "{len} bytes to a {cells}-cell ring");
        }
        drop((small, sav, scq, sd));
    }
    drop((big, bav, bcq, bd));
}
