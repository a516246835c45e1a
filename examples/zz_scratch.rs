use shmfab::{CqAttr, CqTaggedEntry, Fabric, FI_RECV, FI_TRANSMIT};
use std::time::Instant;
fn main() -> Result<(), Box<dyn std::error::Error>> {
    std::env::set_var("SHMFAB_JOB_ID", format!("zz-{}", std::process::id()));
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
    let sizes: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    for size in sizes {
        let mut v = vec![0u8; 4 * size + 4 * 4096];
        let base = v.as_mut_ptr().align_offset(4096);
        let (s0, rest) = v[base..].split_at_mut(size + 4096);
        let (s1, rest) = rest.split_at_mut(size + 4096);
        let (r0, r1) = rest.split_at_mut(size + 4096);
        let n: usize = std::env::var("ZZ_N").map(|v| v.parse().unwrap()).unwrap_or(20000);
        let mut t = Instant::now();
        for i in 0..n + 1000 {
            if i == 1000 {
                t = Instant::now();
            }
            unsafe {
                ep1.trecv(&mut r1[..size], a0, 5, 0, 1)?;
                ep0.trecv(&mut r0[..size], a1, 6, 0, 2)?;
            }
            unsafe {
                ep0.tsend(&s0[..size], a1, 5, 3)?;
            }
            let mut got = 0;
            while got < 2 {
                if let Ok(k) = cq1.read(&mut e) {
                    got += k
                };
                if let Ok(k) = cq0.read(&mut e) {
                    got += k
                }
            }
            unsafe {
                ep1.tsend(&s1[..size], a0, 6, 4)?;
            }
            let mut got = 0;
            while got < 2 {
                if let Ok(k) = cq0.read(&mut e) {
                    got += k
                };
                if let Ok(k) = cq1.read(&mut e) {
                    got += k
                }
            }
        }
        println!("{size}: {:.3} us per half trip in process", t.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64);
    }
    Ok(())
}
