//! Empty CQ reads (nothing sent): the cost of one poll that finds nothing,
//! with one connected peer, for `scripts/profile.sh`.
//!
//! Usage: `emptyread [reads]` (default 1000000).

use shmfab::{CqAttr, CqTaggedEntry, Fabric, FI_RECV, FI_TRANSMIT};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let reads: usize = std::env::args().nth(1).map_or(Ok(1_000_000), |a| a.parse())?;
    std::env::set_var("SHMFAB_JOB_ID", format!("emptyread-{}", std::process::id()));
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
    av1.insert(&[ep0.getname()])?;
    // One message, so that ep1 has a ring from ep0 to look at.
    let mut b = [0u8; 8];
    // SAFETY: b outlives the completion read just below.
    unsafe { ep1.trecv(&mut b, shmfab::FI_ADDR_UNSPEC, 5, 0, 1)? };
    ep0.tinject(b"12345678", a1, 5)?;
    let mut e = [CqTaggedEntry::default(); 16];
    while !matches!(cq1.read(&mut e), Ok(1)) {}
    let mut empty = 0usize;
    for _ in 0..reads {
        if cq1.read(&mut e).is_err() {
            empty += 1;
        }
    }
    assert_eq!(empty, reads);
    println!("empty reads: {empty}");
    Ok(())
}
