//! 8-byte ping-pong between two endpoints of one process (two domains, as
//! two ranks would have), for counting the instructions of the hot path:
//! `scripts/profile.sh` runs it under callgrind. Each round posts 64
//! receives per side, then makes 64 round trips (tinject, then the CQ
//! read that finds it, one way and back).
//!
//! With `--empty`, it instead makes that many CQ reads that find nothing
//! (after one message, so that the reading endpoint has a ring to look
//! at): the iteration of a poll loop.
//!
//! With `--stream`, the receive side of the message rate instead: each
//! round posts 64 receives on one endpoint, injects 64 messages from the
//! other, then reads the 64 completions 16 at a time (as `shmfab bench
//! msgrate`'s receiver does).
//!
//! Usage: `halftrip [rounds]` (default 2000), `halftrip --empty [reads]`
//! (default 1000000), `halftrip --stream [rounds]` (default 2000); prints
//! what it made.

use shmfab::{CqAttr, CqTaggedEntry, Fabric, FI_ADDR_UNSPEC, FI_RECV, FI_TRANSMIT};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).peekable();
    let empty = args.next_if(|a| a == "--empty").is_some();
    let stream = !empty && args.next_if(|a| a == "--stream").is_some();
    let n: usize = args.next().map_or(Ok(if empty { 1_000_000 } else { 2000 }), |a| a.parse())?;
    std::env::set_var("SHMFAB_JOB_ID", format!("halftrip-{}", std::process::id()));
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
    if empty {
        let mut b = [0u8; 8];
        // SAFETY: b outlives the completion read just below.
        unsafe { ep1.trecv(&mut b, FI_ADDR_UNSPEC, 5, 0, 1)? };
        ep0.tinject(b"12345678", a1, 5)?;
        while !matches!(cq1.read(&mut e), Ok(1)) {}
        let found = (0..n).filter(|_| cq1.read(&mut e).is_ok()).count();
        assert_eq!(found, 0);
        println!("empty reads: {n}");
        return Ok(());
    }
    if stream {
        let mut bufs = [[0u8; 8]; 64];
        for _ in 0..n {
            for b in bufs.iter_mut() {
                // SAFETY: bufs outlive the completions read below.
                unsafe { ep1.trecv(b, a0, 5, 0, 1)? };
            }
            for _ in 0..64 {
                ep0.tinject(b"12345678", a1, 5)?;
            }
            let mut got = 0;
            while got < 64 {
                if let Ok(k) = cq1.read(&mut e) {
                    got += k;
                }
            }
        }
        assert_eq!(&bufs[63], b"12345678");
        println!("streamed messages: {}", n * 64);
        return Ok(());
    }
    let mut there = [[0u8; 8]; 64];
    let mut back = [[0u8; 8]; 64];
    for _ in 0..n {
        for (x, y) in there.iter_mut().zip(back.iter_mut()) {
            // SAFETY: both arrays outlive the completions read below.
            unsafe {
                ep1.trecv(x, a0, 5, 0, 1)?;
                ep0.trecv(y, a1, 6, 0, 2)?;
            }
        }
        for _ in 0..64 {
            ep0.tinject(b"12345678", a1, 5)?;
            while !matches!(cq1.read(&mut e), Ok(1)) {}
            ep1.tinject(b"87654321", a0, 6)?;
            while !matches!(cq0.read(&mut e), Ok(1)) {}
        }
    }
    assert_eq!((&there[63], &back[63]), (b"12345678", b"87654321"));
    println!("half trips: {}", n * 128);
    Ok(())
}
