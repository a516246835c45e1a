//! Message semantics across real processes: all-to-all with tags, ignore
//! masks and directed receives, order per pair; truncation, multi-receive,
//! remote CQ data, inject buffer reuse; a flood of unexpected messages.

mod common;
use common::{pattern, run, World};
use shmfab::{ErrorKind, RecvMsg, FI_ADDR_UNSPEC, FI_MULTI_RECV, FI_RECV, FI_REMOTE_CQ_DATA, FI_TAGGED};
use std::io::IoSliceMut;
use std::time::Duration;

const M: usize = 48;
const SIZES: [usize; 8] = [0, 8, 100, 3000, 20000, 70000, 150000, 600000];
const MAXLEN: usize = 600000;

fn seed(from: usize, to: usize, k: usize) -> u64 {
    ((from * 131 + to) * 100003 + k) as u64
}

/// Every rank sends M messages to every other rank: even k tagged with tag
/// (sender << 32 | k), odd k untagged. Receivers take tagged ones with an
/// ignore mask over the low 32 bits (so any k from that sender matches) and
/// untagged ones by directed receive; both must arrive in send order.
fn all_to_all(w: &World, expected: bool) {
    let n = w.size;
    let peers: Vec<usize> = (0..n).filter(|&q| q != w.rank).collect();
    let mut bufs: Vec<Vec<u8>> = Vec::new();
    let mut meta = Vec::new(); // (ctx, from, tagged)
    let mut ctx = 1usize;
    let post = |bufs: &mut Vec<Vec<u8>>, meta: &mut Vec<(usize, usize, bool)>, ctx: &mut usize| {
        for &q in &peers {
            for k in 0..M {
                let tagged = k % 2 == 0;
                bufs.push(vec![0u8; MAXLEN]);
                let b = bufs.last_mut().unwrap();
                // SAFETY: every buffer lives in `bufs` (never reallocated
                // buffers, only the outer Vec) until all completions arrived.
                unsafe {
                    if tagged {
                        w.ep.trecv(b, FI_ADDR_UNSPEC, (q as u64) << 32, 0xffff_ffff, *ctx).unwrap();
                    } else {
                        w.ep.recv(b, w.addrs[q], *ctx).unwrap();
                    }
                }
                meta.push((*ctx, q, tagged));
                *ctx += 1;
            }
        }
    };
    bufs.reserve(peers.len() * M);
    if expected {
        post(&mut bufs, &mut meta, &mut ctx);
        w.barrier();
    }
    // Send, interleaving peers.
    let payloads: Vec<Vec<Vec<u8>>> = (0..n)
        .map(|q| {
            (0..M)
                .map(|k| if q == w.rank { vec![] } else { pattern(SIZES[k % SIZES.len()], seed(w.rank, q, k)) })
                .collect()
        })
        .collect();
    let mut send_ctx = Vec::new();
    #[allow(clippy::needless_range_loop)] // k indexes the inner lists, peers the outer
    for k in 0..M {
        for &q in &peers {
            let c = 1_000_000 + q * M + k;
            let data = &payloads[q][k];
            // SAFETY: payloads live until the send completions below.
            w.retry(|| unsafe {
                if k % 2 == 0 {
                    w.ep.tsend(data, w.addrs[q], ((w.rank as u64) << 32) | k as u64, c)
                } else {
                    w.ep.send(data, w.addrs[q], c)
                }
            });
            send_ctx.push(c);
        }
    }
    if !expected {
        w.barrier();
        post(&mut bufs, &mut meta, &mut ctx);
    }
    // Check receives: per (sender, tagged) stream, k must come in order.
    let mut next_k = vec![[0usize, 1usize]; n];
    let mut sends_seen = std::collections::HashSet::new();
    let mut got = 0;
    while got < meta.len() {
        let (e, src) = w.next_from().unwrap_or_else(|e| panic!("rank {}: error {e:?}", w.rank));
        if e.flags & FI_RECV == 0 {
            assert_eq!(e.flags & shmfab::FI_SEND, shmfab::FI_SEND);
            sends_seen.insert(e.op_context);
            continue;
        }
        let i = meta.iter().position(|m| m.0 == e.op_context).expect("known context");
        let (_, from_posted, tagged_posted) = meta[i];
        assert_eq!(e.flags & FI_TAGGED != 0, tagged_posted, "tagged flag");
        let from = w.addrs.iter().position(|&a| a == src).expect("source in AV");
        if !tagged_posted {
            assert_eq!(from, from_posted, "directed receive took a message from another source");
        }
        let k = if tagged_posted {
            assert_eq!(e.tag >> 32, from as u64, "ignore mask kept the sender bits");
            (e.tag & 0xffff_ffff) as usize
        } else {
            next_k[from][1]
        };
        let stream = if tagged_posted { 0 } else { 1 };
        assert_eq!(
            k,
            next_k[from][stream],
            "rank {}: order from {from} ({})",
            w.rank,
            if tagged_posted { "tagged" } else { "untagged" }
        );
        next_k[from][stream] += 2;
        let want = pattern(SIZES[k % SIZES.len()], seed(from, w.rank, k));
        assert_eq!(e.len, want.len(), "length");
        assert!(bufs[i][..e.len] == want[..], "rank {}: payload of k={k} from {from}", w.rank);
        got += 1;
    }
    // Whatever send completions were read meanwhile sit in the harness's
    // pending list or are still to come: claim every one.
    for c in send_ctx.into_iter().filter(|c| !sends_seen.contains(c)) {
        let e = w.wait_ctx(c).unwrap_or_else(|e| panic!("send error {e:?}")).0;
        assert_eq!(e.flags & shmfab::FI_SEND, shmfab::FI_SEND);
    }
    w.barrier();
}

#[test]
fn all_to_all_four_ranks() {
    run("all_to_all_four_ranks", 4, &[], Duration::from_secs(240), |w| {
        all_to_all(&w, true);
        all_to_all(&w, false);
        assert_eq!(w.unclaimed(), 0);
    });
}

#[test]
fn all_to_all_four_ranks_through_overflow_queue() {
    // One ring slot per endpoint: of three senders to each rank, two use the
    // shared MPSC overflow queue.
    run(
        "all_to_all_four_ranks_through_overflow_queue",
        4,
        &[("SHMFAB_RING_SLOTS", "1")],
        Duration::from_secs(240),
        |w| {
            all_to_all(&w, true);
            all_to_all(&w, false);
            let s = w.ep.stats().unwrap();
            assert!(s.rx_ovf > 0 && s.rx_ring > 0, "{s:?}");
        },
    );
}

#[test]
fn truncation_multirecv_remote_data_inject() {
    run("truncation_multirecv_remote_data_inject", 2, &[], Duration::from_secs(120), |w| {
        truncation(&w);
        multi_recv(&w);
        remote_cq_data(&w);
        inject_reuse(&w);
        assert_eq!(w.unclaimed(), 0);
    });
}

fn truncation(w: &World) {
    // (message, buffer) for inline, bounce and rendezvous messages.
    let cases = [(100usize, 60usize), (50_000, 30_000), (300_000, 200_000), (2 << 20, 1 << 20)];
    for (i, &(len, cap)) in cases.iter().enumerate() {
        for expected in [true, false] {
            let tag = 100 + i as u64 * 2 + expected as u64;
            if w.rank == 1 {
                let mut buf = vec![0x5au8; cap + 64];
                let post = |b: &mut Vec<u8>| {
                    // SAFETY: b lives until the completion below.
                    unsafe { w.ep.trecv(&mut b[..cap], w.addrs[0], tag, 0, 7).unwrap() }
                };
                if expected {
                    post(&mut buf);
                    w.barrier();
                } else {
                    w.barrier();
                    post(&mut buf);
                }
                let e = w.wait_ctx(7).expect_err("a truncated receive completes as an error");
                assert_eq!(e.err, ErrorKind::Trunc.errno());
                assert_eq!(e.olen, len - cap, "olen");
                assert_eq!(e.len, cap, "the part that fits is delivered");
                assert_eq!(e.tag, tag);
                let want = pattern(len, tag);
                assert!(buf[..cap] == want[..cap], "delivered prefix ({len} into {cap})");
                assert!(buf[cap..].iter().all(|&b| b == 0x5a), "nothing written past the buffer");
                let text = w.cq.last_error_text().unwrap();
                assert!(text.contains("truncated"), "{text}");
            } else {
                let data = pattern(len, tag);
                if expected {
                    w.barrier();
                }
                // SAFETY: data lives until the send completion.
                w.retry(|| unsafe { w.ep.tsend(&data, w.addrs[1], tag, 8) });
                if !expected {
                    w.barrier();
                }
                w.ok(8);
            }
        }
    }
    w.barrier();
}

fn multi_recv(w: &World) {
    const LEN: usize = 500;
    const BUF: usize = 4096;
    if w.rank == 1 {
        w.ep.set_min_multi_recv(256).unwrap();
        let mut big = vec![0u8; BUF];
        let base = big.as_ptr() as usize;
        let mut rest = vec![0u8; 2 * LEN];
        // SAFETY: big and rest live until every completion below.
        unsafe {
            let mut iov = [IoSliceMut::new(&mut big)];
            let mut m = RecvMsg { iov: &mut iov, src: FI_ADDR_UNSPEC, context: 50, tag: 0, ignore: 0 };
            w.ep.recvmsg(&mut m, FI_MULTI_RECV).unwrap();
            w.ep.recv(&mut rest[..LEN], FI_ADDR_UNSPEC, 51).unwrap();
        }
        w.barrier();
        // 8 messages fit (each takes 504 bytes with alignment; after the
        // 8th, 64 < 256 bytes remain and the buffer is released).
        let mut offs = Vec::new();
        for i in 0..8 {
            let e = w.ok(50);
            assert_eq!(e.len, LEN);
            assert!(e.buf >= base && e.buf + LEN <= base + BUF, "buf inside the multi-recv buffer");
            let off = e.buf - base;
            assert!(big[off..off + LEN] == pattern(LEN, 300 + i)[..], "message {i} content");
            assert_eq!(e.flags & FI_MULTI_RECV != 0, i == 7, "only the last one releases the buffer");
            offs.push(off);
        }
        assert!(offs.windows(2).all(|p| p[1] >= p[0] + LEN), "messages do not overlap: {offs:?}");
        let e = w.ok(51);
        assert_eq!(e.len, LEN);
        assert!(rest[..LEN] == pattern(LEN, 308)[..], "ninth message went to the next receive");
    } else {
        w.barrier();
        for i in 0..9u64 {
            w.retry(|| w.ep.inject(&pattern(LEN, 300 + i), w.addrs[1]));
        }
    }
    w.barrier();
}

fn remote_cq_data(w: &World) {
    if w.rank == 1 {
        let mut b = vec![0u8; 300_000];
        for (ctx, want_data) in [(60usize, Some(0xdead_beef_u64)), (61, None), (62, Some(7)), (63, Some(u64::MAX))] {
            // SAFETY: b lives until the completion.
            unsafe { w.ep.recv(&mut b, w.addrs[0], ctx).unwrap() };
            let e = w.ok(ctx);
            assert_eq!(e.flags & FI_REMOTE_CQ_DATA != 0, want_data.is_some(), "ctx {ctx}");
            assert_eq!(e.data, want_data.unwrap_or(0), "ctx {ctx}");
        }
        // Tagged, with data.
        // SAFETY: b lives until the completion read just below.
        unsafe { w.ep.trecv(&mut b, w.addrs[0], 9, 0, 64).unwrap() };
        let e = w.ok(64);
        assert_eq!((e.data, e.tag, e.flags & FI_REMOTE_CQ_DATA != 0), (42, 9, true));
    } else {
        let big = pattern(200_000, 1);
        // SAFETY: buffers live until the send completions below.
        unsafe {
            w.retry(|| w.ep.senddata(b"abc", 0xdead_beef, w.addrs[1], 70));
            w.retry(|| w.ep.send(b"abc", w.addrs[1], 71));
            w.retry(|| w.ep.senddata(&big, 7, w.addrs[1], 72));
        }
        w.retry(|| w.ep.injectdata(b"x", u64::MAX, w.addrs[1]));
        // SAFETY: as above.
        unsafe { w.retry(|| w.ep.tsenddata(b"tagged", 42, w.addrs[1], 9, 73)) };
        for c in [70, 71, 72, 73] {
            w.ok(c);
        }
    }
    w.barrier();
}

fn inject_reuse(w: &World) {
    const N: usize = 2000;
    const LEN: usize = 4096;
    if w.rank == 0 {
        let mut buf = vec![0u8; LEN];
        for i in 0..N {
            buf.fill(i as u8);
            buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
            w.retry(|| w.ep.inject(&buf, w.addrs[1]));
            // The buffer is ours again at once: scribble on it.
            buf.fill(0xff);
        }
        w.barrier();
    } else {
        // Let many injects queue behind a full ring (copied), then drain.
        w.barrier();
        let mut b = vec![0u8; LEN];
        for i in 0..N {
            // SAFETY: b lives until the completion.
            unsafe { w.ep.recv(&mut b, w.addrs[0], 80).unwrap() };
            let e = w.ok(80);
            assert_eq!(e.len, LEN);
            assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), i as u64, "order");
            assert!(b[8..].iter().all(|&x| x == i as u8), "inject {i}: content is what it was at the call");
        }
    }
    w.barrier();
}

#[test]
fn unexpected_flood_backpressure_then_all_delivered() {
    // A small unexpected budget and transmit queue: the sender must hit
    // -FI_EAGAIN while the receiver has posted nothing; then the receiver
    // posts everything and every message arrives, in order, intact.
    let env = [("SHMFAB_UNEXP_MAX", "64k"), ("SHMFAB_TX_SIZE", "512"), ("SHMFAB_RING_CELLS", "256")];
    run("unexpected_flood_backpressure_then_all_delivered", 2, &env, Duration::from_secs(120), flood);
}

#[test]
fn unexpected_flood_backpressure_cma_off() {
    // Without single copy a large message's data comes through the same
    // ring as the flood, behind messages the receiver has no budget for:
    // it must still be drained (regression: this deadlocked).
    let env =
        [("SHMFAB_UNEXP_MAX", "64k"), ("SHMFAB_TX_SIZE", "512"), ("SHMFAB_RING_CELLS", "256"), ("SHMFAB_CMA", "off")];
    run("unexpected_flood_backpressure_cma_off", 2, &env, Duration::from_secs(120), flood);
}

#[test]
fn all_to_all_four_ranks_cma_off() {
    run("all_to_all_four_ranks_cma_off", 4, &[("SHMFAB_CMA", "off")], Duration::from_secs(240), |w| {
        all_to_all(&w, true);
        all_to_all(&w, false);
    });
}

fn flood(w: World) {
    {
        const N: usize = 3000;
        // Mostly inline sizes (the unexpected budget runs out), a bounce
        // or rendezvous message now and then.
        let len = |i: usize| match i % 50 {
            49 => 200_000,
            24 => 40_000,
            k => [700usize, 24, 5000, 3000, 100][k % 5],
        };
        let flag = std::path::PathBuf::from(std::env::var("SHMFAB_TEST_DIR").unwrap()).join("saw-eagain");
        if w.rank == 0 {
            let data: Vec<Vec<u8>> = (0..N).map(|i| pattern(len(i), i as u64)).collect();
            let mut again = 0;
            let t0 = std::time::Instant::now();
            for (i, d) in data.iter().enumerate() {
                // SAFETY: data lives until the send completions below.
                while let Err(e) = unsafe { w.ep.send(d, w.addrs[1], i) } {
                    assert_eq!(e.kind(), ErrorKind::Again, "{e}");
                    if again == 0 {
                        std::fs::write(&flag, b"1").unwrap();
                    }
                    again += 1;
                    w.dom.wait(Some(Duration::from_millis(1)));
                    w.dom.progress().unwrap();
                    assert!(t0.elapsed() < Duration::from_secs(60), "stuck on -FI_EAGAIN");
                }
            }
            assert!(again > 0, "the flood must meet back-pressure");
            assert!(w.ep.stats().unwrap().tx_again > 0);
            for i in 0..N {
                w.ok(i);
            }
        } else {
            let t0 = std::time::Instant::now();
            // Drain what the budget allows until the receiver has had to
            // leave messages in place and the sender has met -FI_EAGAIN.
            while !flag.exists() || w.ep.stats().unwrap().stalls == 0 {
                w.dom.progress().unwrap();
                assert!(t0.elapsed() < Duration::from_secs(60), "no back-pressure: {:?}", w.ep.stats().unwrap());
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut b = vec![0u8; 200_000];
            for i in 0..N {
                // SAFETY: b lives until the completion.
                unsafe { w.ep.recv(&mut b, w.addrs[0], i).unwrap() };
                let e = w.ok(i);
                assert_eq!(e.len, len(i), "message {i}");
                assert!(b[..e.len] == pattern(len(i), i as u64)[..], "message {i} content");
            }
        }
        w.barrier();
    }
}

/// Order per pair across every protocol, with ping-pongs between bursts
/// (a ring that puts messages elsewhere once it knows it is empty, as a
/// hot-area design tried in session 9 did, must keep this): each round,
/// both ranks play a short 8-byte ping-pong, then each sends the other a
/// burst mixing sizes (8 B, 24 B
/// and 1 KiB inline, 4000 B inline past the first cell, 20 KiB through the
/// pool, 64 KiB by rendezvous), some tagged and some untagged, some
/// received expected and some unexpected. Receives match any tag, so the
/// i-th receive posted must get the i-th message sent, intact.
#[test]
fn order_across_sizes_with_ping_pongs_between() {
    run("order_across_sizes_with_ping_pongs_between", 2, &[], Duration::from_secs(120), |w| {
        mixed_order(&w);
        assert_eq!(w.unclaimed(), 0);
    });
}

fn mixed_order(w: &World) {
    const ROUNDS: usize = 60;
    const BURST: [usize; 9] = [8, 1024, 65536, 8, 24, 4000, 20000, 8, 1024];
    let peer = w.addrs[1 - w.rank];
    let mut seq = 0u64; // messages sent to the peer so far
    let mut want = 0u64; // messages received from it so far
    let mut bufs: Vec<Vec<u8>> = BURST.iter().map(|_| vec![0u8; 65536]).collect();
    for round in 0..ROUNDS {
        // Ping-pong of 8-byte messages (tagged, matching any tag too).
        for _ in 0..3 {
            let mut b = [0u8; 8];
            let ping = |seq: &mut u64| {
                let data = pattern(8, *seq);
                w.retry(|| w.ep.tinject(&data, peer, *seq));
                *seq += 1;
            };
            let pong = |want: &mut u64, b: &mut [u8; 8]| {
                // SAFETY: b lives until the completion read just below.
                unsafe { w.ep.trecv(b, peer, 0, !0, 7).unwrap() };
                let e = w.ok(7);
                assert_eq!((e.tag, &b[..]), (*want, &pattern(8, *want)[..]), "rank {}: ping-pong order", w.rank);
                *want += 1;
            };
            if w.rank == 0 {
                ping(&mut seq);
                pong(&mut want, &mut b);
            } else {
                pong(&mut want, &mut b);
                ping(&mut seq);
            }
        }
        // The burst, with the receives posted before (expected) on even
        // rounds, after (unexpected) on odd ones.
        let expected = round % 2 == 0;
        let post = |bufs: &mut Vec<Vec<u8>>| {
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: the buffers live until their completions below.
                unsafe {
                    if i % 3 == 2 {
                        w.ep.recv(b, peer, 100 + i).unwrap()
                    } else {
                        w.ep.trecv(b, peer, 0, !0, 100 + i).unwrap()
                    }
                }
            }
        };
        if expected {
            post(&mut bufs);
        }
        let data: Vec<Vec<u8>> = BURST.iter().enumerate().map(|(i, &len)| pattern(len, seq + i as u64)).collect();
        for (i, d) in data.iter().enumerate() {
            // SAFETY: data lives until the send completions below.
            w.retry(|| unsafe {
                if i % 3 == 2 {
                    w.ep.send(d, peer, 200 + i)
                } else {
                    w.ep.tsend(d, peer, seq + i as u64, 200 + i)
                }
            });
        }
        if !expected {
            w.barrier();
            post(&mut bufs);
        }
        for (i, &len) in BURST.iter().enumerate() {
            let e = w.ok(100 + i);
            let k = want + i as u64;
            assert_eq!(e.len, len, "rank {}: round {round}: message {i} of the burst: length", w.rank);
            if i % 3 != 2 {
                assert_eq!(e.tag, k, "rank {}: round {round}: message {i}: order", w.rank);
            }
            assert!(bufs[i][..len] == pattern(len, k)[..], "rank {}: round {round}: message {i}: payload", w.rank);
        }
        for i in 0..BURST.len() {
            w.ok(200 + i);
        }
        seq += BURST.len() as u64;
        want += BURST.len() as u64;
        if expected {
            w.barrier();
        }
    }
    w.barrier();
}
