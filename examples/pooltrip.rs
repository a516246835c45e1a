//! Ping-pong of one size between two endpoints of one process (two
//! domains, as two ranks would have), for counting the instructions of the
//! pool path (16-64 KiB messages) under callgrind: each round posts a
//! receive per side, sends one way, reads the completion, and back. One
//! thread, so no pipelining: what it shows is the software and the copies.
//!
//! Usage: `pooltrip SIZE [rounds]` (rounds default 200); prints what it
//! made and the fastest batch's time per half trip (one core: the
//! software and the copies, no cross-core transfer). Every received byte
//! is checked in the last round.

use shmfab::{CqAttr, CqTaggedEntry, Fabric, FI_RECV, FI_TRANSMIT};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let size: usize = args.next().ok_or("usage: pooltrip SIZE [rounds]")?.parse()?;
    let n: usize = args.next().map_or(Ok(200), |a| a.parse())?;
    std::env::set_var("SHMFAB_JOB_ID", format!("pooltrip-{}", std::process::id()));
    let fab = Fabric::open()?;
    let (d0, d1) = (fab.domain()?, fab.domain()?);
    let (cq0, cq1) = (d0.cq_open(&CqAttr::default())?, d1.cq_open(&CqAttr::default())?);
    let (av0, av1) = (d0.av_open()?, d1.av_open()?);
    let (ep0, ep1) = (d0.endpoint()?, d1.endpoint()?);
    for (ep, cq, av) in [(&ep0, &cq0, &av0), (&ep1, &cq1, &av1)] {
        ep.bind_cq(cq, FI_TRANSMIT | FI_RECV)?;
        ep.bind_av(av)?;
        ep.enable()?;
    }
    let a1 = av0.insert(&[ep1.getname()])?[0];
    let a0 = av1.insert(&[ep0.getname()])?[0];
    let mut e = [CqTaggedEntry::default(); 16];
    let src0: Vec<u8> = (0..size).map(|i| (i * 7 + 1) as u8).collect();
    let src1: Vec<u8> = (0..size).map(|i| (i * 13 + 5) as u8).collect();
    let (mut r0, mut r1) = (vec![0u8; size], vec![0u8; size]);
    // Reads both CQs (both endpoints progress: a rendezvous through
    // the pool needs its sender's passes) until `cq1` has given `w1`
    // completions and `cq0` `w0`, counting from `c`.
    let wait = |e: &mut [CqTaggedEntry], c: &mut (usize, usize), w0: usize, w1: usize| {
        while c.0 < w0 || c.1 < w1 {
            if let Ok(k) = cq0.read(&mut e[..]) {
                c.0 += k;
            }
            if let Ok(k) = cq1.read(&mut e[..]) {
                c.1 += k;
            }
        }
    };
    // Time per half trip: the fastest of batches of 20 round trips (the
    // least disturbed by other work on the machine).
    let mut best = f64::MAX;
    let mut t0 = std::time::Instant::now();
    for round in 0..n {
        if round % 20 == 0 {
            if round > 0 {
                best = best.min(t0.elapsed().as_secs_f64() / 40.0);
            }
            t0 = std::time::Instant::now();
        }
        let mut c = (0, 0);
        // SAFETY: the buffers outlive the completions read below.
        unsafe {
            ep1.trecv(&mut r1, a0, 5, 0, 1)?;
            ep0.trecv(&mut r0, a1, 6, 0, 2)?;
            ep0.tsend(&src0, a1, 5, 3)?;
        }
        wait(&mut e, &mut c, 0, 1);
        // SAFETY: as above.
        unsafe { ep1.tsend(&src1, a0, 6, 4)? };
        wait(&mut e, &mut c, 2, 2);
    }
    assert!(r1 == src0 && r0 == src1, "bytes differ");
    println!("round trips: {n} of {size} B; fastest batch: {:.3} us per half trip", best * 1e6);
    Ok(())
}
