//! Bidirectional bandwidth, as osu_bibw measures it: both ranks post a
//! window of receives, send a window, wait for both, then exchange a
//! small acknowledgement; the figure is the bytes both moved per second.
//!
//! ```text
//! cargo build --release --example bibw
//! shmfab run -n 2 -- target/release/examples/bibw [--sizes 16k,32k] [--window 64] [--iters 200]
//! ```
//! Prints `bibw size=S window=W gbps=...` per size (rank 0), the median
//! of 5 timed runs.

use shmfab::{CqTaggedEntry, ErrorKind, World, FI_ADDR_UNSPEC};
use std::time::Instant;

mod common;
use common::size_arg;

fn main() {
    let mut sizes = vec![8192, 16384, 24576, 32768, 65536];
    let (mut window, mut iters) = (64usize, 200usize);
    let mut uni = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--uni" {
            uni = true;
            continue;
        }
        let v = args.next().expect("a value");
        match a.as_str() {
            "--sizes" => sizes = v.split(',').map(size_arg).collect(),
            "--window" => window = v.parse().expect("a count"),
            "--iters" => iters = v.parse().expect("a count"),
            _ => panic!("unknown option {a}"),
        }
    }
    let w = World::init().expect("run under shmfab run or mpirun");
    assert_eq!(w.size, 2, "two ranks");
    let peer = w.addr(1 - w.rank);
    let mut e = [CqTaggedEntry::default(); 64];
    for &size in &sizes {
        let src = vec![0x5au8; size * window];
        let mut dst = vec![0u8; size * window];
        let mut ack = [0u8; 8];
        let mut run = |n: usize| -> f64 {
            w.barrier().unwrap();
            let t = Instant::now();
            for _ in 0..n {
                let (sends, recvs) = (!uni || w.rank == 0, !uni || w.rank == 1);
                for k in (0..window).filter(|_| recvs) {
                    // SAFETY: dst outlives the completions waited for below.
                    unsafe { w.ep.trecv(&mut dst[k * size..][..size], peer, 7, 0, 1).unwrap() };
                }
                let mut done = 0;
                for k in (0..window).filter(|_| sends) {
                    loop {
                        // SAFETY: src outlives the completions waited for below.
                        match unsafe { w.ep.tsend(&src[k * size..][..size], peer, 7, 2) } {
                            Ok(()) => break,
                            Err(x) if x.kind() == ErrorKind::Again => {
                                if let Ok(k) = w.cq.read(&mut e) {
                                    done += k;
                                }
                            }
                            Err(x) => panic!("{x}"),
                        }
                    }
                }
                while done < (sends as usize + recvs as usize) * window {
                    if let Ok(k) = w.cq.read(&mut e) {
                        done += k;
                    }
                }
                // SAFETY: ack outlives the completion read below.
                unsafe { w.ep.trecv(&mut ack, FI_ADDR_UNSPEC, 8, 0, 3).unwrap() };
                w.ep.tinject(b"ack_ack_", peer, 8).unwrap();
                let mut got = 0;
                while got < 1 {
                    if let Ok(k) = w.cq.read(&mut e) {
                        got += k;
                    }
                }
            }
            t.elapsed().as_secs_f64()
        };
        run(iters / 10 + 1);
        let ways = if uni { 1.0 } else { 2.0 };
        let before = w.ep.stats().unwrap();
        let mut v: Vec<f64> = (0..5).map(|_| ways * (size * window * iters) as f64 / run(iters) / 1e9).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let s = w.ep.stats().unwrap();
        if w.rank == 0 {
            println!(
                "{} size={size} window={window} gbps={:.2} inline={} pool={} streamed={} rndv={}",
                if uni { "bw" } else { "bibw" },
                v[2],
                s.tx_inline - before.tx_inline,
                s.tx_bounce - before.tx_bounce,
                s.tx_streamed - before.tx_streamed,
                s.tx_rndv - before.tx_rndv
            );
        } else if uni {
            // The receiver's side of the rendezvous messages: read by
            // single copy, or taken through the pool by its pick.
            eprintln!(
                "bw size={size} receiver cma_reads={} pool_picked={}",
                s.cma_reads - before.cma_reads,
                s.pool_picked - before.pool_picked
            );
        }
    }
    w.barrier().unwrap();
}
