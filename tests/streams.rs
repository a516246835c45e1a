//! Streams of large inline-sized messages (`SHMFAB_STREAM_MIN`, 8 KiB by
//! default): a message that answers nothing, sent while the last large
//! one to that peer is still in its ring, goes through the pool; so does
//! one the ring has no room for at its turn. Every byte arrives, in send
//! order, whichever way each message went; the sender's counters say
//! which way that was. Ping-pong turns (answers) keep the ring.

mod common;
use common::{pattern, put_file, run, test_dir};
use shmfab::{EpStats, SendMsg, FI_COMPLETION, FI_DELIVERY_COMPLETE};
use std::io::IoSlice;
use std::time::{Duration, Instant};

/// Single copy from 64 KiB (the default is 8 KiB, from where messages
/// go by rendezvous unless streamed or after a pick of the pool: tests
/// of the rendezvous classes are in rndv_fin.rs, and the last test here
/// runs with the defaults): the messages here take the ring or the pool.
const RING_SIZES: (&str, &str) = ("SHMFAB_CMA_MIN", "65536");

/// One tag for every message: each receive takes the next message in send
/// order, so a message overtaking another would land in the wrong buffer.
const TAG: u64 = 5;

/// Waits (without touching the endpoint) for the other rank's mark.
fn wait_mark(name: &str) {
    let t0 = Instant::now();
    while !test_dir().join(name).exists() {
        assert!(t0.elapsed() < Duration::from_secs(60), "no {name} mark");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Rank 0 sends `lens` back to back, all with [`TAG`], while rank 1 does
/// not progress (so the first large message stays in its ring, and so
/// does any room it took); then rank 1 posts its receives in order and
/// checks each buffer. `dc_at`: the message sent with
/// FI_DELIVERY_COMPLETE, if any. `wait_sent`: rank 0 waits for its send
/// completions before it lets rank 1 go (every send must then have left
/// without the receiver's help: through the pool, or inline into room).
/// `check` gets rank 0's counters over the sends. The callers of the
/// ring's paths pin [`RING_SIZES`].
fn stream(
    name: &str,
    env: &[(&str, &str)],
    lens: &'static [usize],
    dc_at: Option<usize>,
    wait_sent: bool,
    check: fn(EpStats),
) {
    run(name, 2, env, Duration::from_secs(120), move |w| {
        let peer = w.addrs[1 - w.rank];
        w.barrier();
        if w.rank == 0 {
            // Rank 1 is out of the barrier and will not progress until
            // the "sent" mark.
            wait_mark("quiet");
            let before = w.ep.stats().unwrap();
            let msgs: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| pattern(l, i as u64)).collect();
            for (i, m) in msgs.iter().enumerate() {
                let iov = [IoSlice::new(m)];
                let sm = SendMsg { iov: &iov, dest: peer, context: 100 + i, data: 0, tag: TAG };
                let dc = if dc_at == Some(i) { FI_DELIVERY_COMPLETE } else { 0 };
                // SAFETY: msgs outlives every completion waited for below.
                w.retry(|| unsafe { w.ep.tsendmsg(&sm, FI_COMPLETION | dc) });
            }
            if wait_sent {
                for i in 0..lens.len() {
                    w.ok(100 + i);
                }
                put_file("sent", "");
            } else {
                put_file("sent", "");
                for i in 0..lens.len() {
                    w.ok(100 + i);
                }
            }
            let after = w.ep.stats().unwrap();
            let d = EpStats {
                tx_inline: after.tx_inline - before.tx_inline,
                tx_bounce: after.tx_bounce - before.tx_bounce,
                tx_streamed: after.tx_streamed - before.tx_streamed,
                tx_rndv: after.tx_rndv - before.tx_rndv,
                ..EpStats::default()
            };
            assert_eq!(d.tx_inline + d.tx_bounce + d.tx_rndv, lens.len() as u64, "every send counted once: {d:?}");
            assert!(d.tx_streamed <= d.tx_bounce, "{d:?}");
            check(d);
        } else {
            put_file("quiet", "");
            wait_mark("sent");
            let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: bufs outlives every completion waited for below.
                unsafe { w.ep.trecv(b, peer, TAG, 0, 200 + i).unwrap() };
            }
            for (i, b) in bufs.iter().enumerate() {
                let e = w.ok(200 + i);
                assert_eq!(e.len, lens[i], "message {i}: its length (sent in order)");
                assert!(*b == pattern(lens[i], i as u64), "message {i}: bytes");
            }
        }
        w.barrier();
    });
}

/// Large (>= 8 KiB) and small messages mixed: 9 large, 3 small.
const MIXED: [usize; 12] = [16384, 8192, 12000, 6000, 16384, 9000, 4096, 16383, 8193, 100, 16384, 10000];

/// The default: the first large message inline (the receiver's ring was
/// empty), each later large one through the pool (the one before it is
/// still in the ring: the receiver does not progress), the small ones
/// inline between them.
#[test]
fn a_stream_of_large_messages_takes_the_pool_after_its_first() {
    stream("a_stream_of_large_messages_takes_the_pool_after_its_first", &[RING_SIZES], &MIXED, None, true, |d| {
        let large = MIXED.iter().filter(|&&l| l >= 8192).count() as u64;
        assert_eq!(large, 9);
        assert_eq!((d.tx_inline, d.tx_bounce, d.tx_streamed), (1 + 3, large - 1, large - 1), "{d:?}");
    });
}

/// `SHMFAB_STREAM_MIN=0`: every message may stream, the small ones too.
#[test]
fn with_a_zero_stream_threshold_every_message_after_the_first_streams() {
    stream(
        "with_a_zero_stream_threshold_every_message_after_the_first_streams",
        &[RING_SIZES, ("SHMFAB_STREAM_MIN", "0")],
        &MIXED,
        None,
        true,
        |d| assert_eq!((d.tx_inline, d.tx_streamed), (1, MIXED.len() as u64 - 1), "{d:?}"),
    );
}

/// Streams off (`SHMFAB_STREAM_MIN` above every size): everything inline,
/// the sends past the ring's room waiting for the receiver.
#[test]
fn with_streams_off_every_message_waits_for_the_ring() {
    stream(
        "with_streams_off_every_message_waits_for_the_ring",
        &[RING_SIZES, ("SHMFAB_STREAM_MIN", "1099511627776")],
        &MIXED,
        None,
        false,
        |d| assert_eq!((d.tx_inline, d.tx_streamed), (MIXED.len() as u64, 0), "{d:?}"),
    );
}

/// Small messages fill the receiver's ring (15 of 4 KiB, 65 cells each:
/// 975 of its 1,024), then a large one follows: the first large message
/// of the stream, but the ring has no room for it, so it goes through
/// the pool (its header and chunk messages fit). The next 4 KiB one
/// waits for room; the large ones after it stream behind the first.
/// Every byte arrives in order once the receiver progresses.
const FULL: [usize; 19] = [
    4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 4096, 16384, 4096, 12288, 8192,
];

#[test]
fn a_large_message_the_full_ring_cannot_take_goes_through_the_pool() {
    stream("a_large_message_the_full_ring_cannot_take_goes_through_the_pool", &[RING_SIZES], &FULL, None, false, |d| {
        assert_eq!((d.tx_inline, d.tx_bounce, d.tx_streamed), (16, 3, 3), "{d:?}");
    });
}

/// A ping-pong of 8-16 KiB messages: each turn answers the peer, so every
/// message goes inline (piped), none through the pool.
#[test]
fn ping_pong_turns_keep_the_ring() {
    run("ping_pong_turns_keep_the_ring", 2, &[RING_SIZES], Duration::from_secs(60), |w| {
        const ROUNDS: u64 = 20;
        for (k, len) in [8192usize, 12000, 16384].into_iter().enumerate() {
            let (before, after) = common::ping_pong(&w, len, ROUNDS, k as u64 * 1000);
            let (inline, pool, streamed) = (
                after.tx_inline - before.tx_inline,
                after.tx_bounce - before.tx_bounce,
                after.tx_streamed - before.tx_streamed,
            );
            assert_eq!((inline, pool, streamed), (ROUNDS, 0, 0), "len {len}: {after:?}");
            w.barrier();
        }
    });
}

/// A large message queued behind small ones that wait for ring room (so
/// it was queued inline) and that, at its turn, finds the ring too full
/// for it goes through the pool then (the queue's pass), instead of
/// waiting. Two endpoints of one process (two domains, as two ranks would
/// have), so that the receiver drains exactly when told: 15 messages of 4
/// KiB fill the ring, 15 more, a 16 KiB one and 6 others wait in the
/// queue; the
/// receiver's one pass takes the first 15 (`RING_BATCH` is 16), the
/// sender's pass then pushes the next 15 into the room, and the 16 KiB
/// message no longer fits. The messages queued behind it (large and
/// small) still arrive after it, in order.
#[test]
fn a_queued_large_message_that_finds_the_ring_full_goes_through_the_pool() {
    use shmfab::{CqTaggedEntry, ErrorKind, Fabric};
    std::env::set_var("SHMFAB_JOB_ID", format!("streams-queued-{}", std::process::id()));
    let open = || {
        let cfg = shmfab::Config { cma_min: 65536, ..shmfab::Config::default() };
        let dom = Fabric::with_config(cfg).unwrap().domain().unwrap();
        let (cq, av, ep) = common::open_endpoint(&dom);
        (dom, cq, av, ep)
    };
    let (sd, scq, sav, tx) = open();
    let (rd, rcq, rav, rx) = open();
    let to = sav.insert(&[rx.getname()]).unwrap()[0];
    let from = rav.insert(&[tx.getname()]).unwrap()[0];
    let mut lens = vec![4096usize; 30];
    lens.push(16384);
    // Behind it in the queue: each must arrive after it, in order.
    lens.extend([4096usize, 12000, 100, 4096, 16384, 9000]);
    let msgs: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| pattern(l, 7 + i as u64)).collect();
    for (i, m) in msgs.iter().enumerate() {
        // SAFETY: msgs outlives every completion read below.
        unsafe { tx.tsend(m, to, TAG, i).unwrap() };
    }
    let before = tx.stats().unwrap();
    assert_eq!((before.tx_inline, before.tx_bounce), (15, 0), "15 fill the ring: {before:?}");
    let mut e = [CqTaggedEntry::default(); 64];
    // One pass of the receiver: it takes 15 unexpected messages.
    assert!(matches!(rcq.read(&mut e), Err(x) if x.kind() == ErrorKind::Again));
    // One pass of the sender: 15 more into the room, then the 16 KiB one.
    sd.progress().unwrap();
    let mid = tx.stats().unwrap();
    assert_eq!((mid.tx_inline, mid.tx_bounce, mid.tx_streamed), (30, 1, 1), "{mid:?}");
    let mut bufs: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        // SAFETY: bufs outlives every completion read below.
        unsafe { rx.trecv(b, from, TAG, 0, 100 + i).unwrap() };
    }
    let (mut got, mut sent) = (Vec::new(), 0);
    let t0 = Instant::now();
    while got.len() < lens.len() || sent < lens.len() {
        if let Ok(k) = rcq.read(&mut e) {
            got.extend(e[..k].iter().map(|x| (x.op_context, x.len)));
        }
        if let Ok(k) = scq.read(&mut e) {
            sent += k;
        }
        sd.progress().unwrap();
        rd.progress().unwrap();
        assert!(t0.elapsed() < Duration::from_secs(10), "got {} of {}, {sent} sends done", got.len(), lens.len());
    }
    let want: Vec<(usize, usize)> = lens.iter().enumerate().map(|(i, &l)| (100 + i, l)).collect();
    assert_eq!(got, want, "every message, in order");
    for (i, b) in bufs.iter().enumerate() {
        assert!(*b == msgs[i], "message {i}: bytes");
    }
    drop((tx, sav, scq, sd, rx, rav, rcq, rd));
}
/// A delivery-complete send goes by rendezvous (its FIN is the receiver's
/// word that the data is in place), stream or not: counted as such, not
/// as streamed. (Found by review: it was counted in both.)
#[test]
fn a_delivery_complete_send_in_a_stream_is_not_counted_as_streamed() {
    stream(
        "a_delivery_complete_send_in_a_stream_is_not_counted_as_streamed",
        &[RING_SIZES],
        &[16384, 16384],
        Some(1),
        false,
        |d| assert_eq!((d.tx_inline, d.tx_rndv, d.tx_streamed), (1, 1, 0), "{d:?}"),
    );
}

/// Two senders stream mixed 4-16 KiB messages to one receiver whose pool
/// is small (16 chunks: a stream's messages wait for chunks the other
/// sender holds), while the receiver posts late for one of them and early
/// for the other; without single copy (`SHMFAB_CMA=off`), so that every
/// message of 8 KiB and more after a sender's first goes through the pool
/// (with it, a stream's messages go by rendezvous until the receiver picks
/// the pool for them, by timing). Every message of each sender arrives
/// whole, in its send order.
#[test]
fn two_streams_share_a_small_pool() {
    const N: usize = 60;
    fn len_of(from: usize, i: usize) -> usize {
        [8192, 16384, 4096, 12000, 9000, 16383][(i + from) % 6]
    }
    let env = [("SHMFAB_POOL_CHUNKS", "16"), ("SHMFAB_CMA", "off")];
    run("two_streams_share_a_small_pool", 3, &env, Duration::from_secs(120), |w| {
        if w.rank == 0 {
            let mut bufs: Vec<Vec<Vec<u8>>> =
                (1..3).map(|f| (0..N).map(|i| vec![0u8; len_of(f, i)]).collect()).collect();
            let post = |from: usize, bufs: &mut Vec<Vec<u8>>| {
                for (i, b) in bufs.iter_mut().enumerate() {
                    // SAFETY: bufs outlives every completion waited for below.
                    unsafe { w.ep.trecv(b, w.addrs[from], TAG, 0, from * 1000 + i).unwrap() };
                }
            };
            let (early, late) = bufs.split_at_mut(1);
            post(1, &mut early[0]);
            w.barrier();
            std::thread::sleep(Duration::from_millis(20));
            post(2, &mut late[0]);
            for from in 1..3 {
                for i in 0..N {
                    assert_eq!(w.ok(from * 1000 + i).len, len_of(from, i), "from {from}, message {i}");
                }
            }
            for (k, v) in bufs.iter().enumerate() {
                for (i, b) in v.iter().enumerate() {
                    assert!(
                        *b == pattern(len_of(k + 1, i), (k * 1000 + i) as u64),
                        "from {}, message {i}: bytes",
                        k + 1
                    );
                }
            }
        } else {
            let to = w.addrs[0];
            let msgs: Vec<Vec<u8>> =
                (0..N).map(|i| pattern(len_of(w.rank, i), ((w.rank - 1) * 1000 + i) as u64)).collect();
            w.barrier();
            for (i, m) in msgs.iter().enumerate() {
                // SAFETY: msgs outlives every completion waited for below.
                w.retry(|| unsafe { w.ep.tsend(m, to, TAG, 100 + i) });
            }
            for i in 0..N {
                w.ok(100 + i);
            }
            let s = w.ep.stats().unwrap();
            assert!(s.tx_streamed > 0, "{s:?}");
        }
        w.barrier();
    });
}

/// With the defaults (single copy from 8 KiB), a stream's messages (sent
/// while another is under way) go by rendezvous until the receiver's
/// answer to one picks the pool for the stream (`engine::tx::StreamWay`;
/// `ep::tests::a_stream_goes_the_way_its_receiver_picks` follows the way
/// through the answers). The receiver does not progress until every send
/// is posted, so no answer comes before: all twelve go by rendezvous
/// (where single copy is usable). Every byte arrives, in order.
#[test]
fn a_stream_under_the_defaults_goes_by_rendezvous_until_its_receiver_answers() {
    // Each send's way is chosen when it is posted: the counters at the end
    // say it.
    stream(
        "a_stream_under_the_defaults_goes_by_rendezvous_until_its_receiver_answers",
        &[],
        &[16384; 12],
        None,
        false,
        |d| {
            let want = 12 * u64::from(shmfab::internal::cma::available());
            assert_eq!((d.tx_rndv, d.tx_inline + d.tx_bounce), (want, 12 - want), "{d:?}");
        },
    );
}
