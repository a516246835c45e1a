//! Many barriers in a row; after each, every rank tells the next rank which
//! barrier it passed, and checks what the previous one says: a rank that
//! ran ahead or fell behind shows as a wrong number.
use shmfab_mpi_tests::*;

fn main() {
    let w = world();
    let (n, r) = (w.size, w.rank);
    let count: u64 = std::env::var("BARRIERS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let t0 = std::time::Instant::now();
    for i in 0..count {
        w.barrier().unwrap_or_else(|e| fail(&w, format!("barrier {i}: {e}")));
        let mut b = [0u8; 8];
        // SAFETY: b lives until the completion below.
        post(&w, || unsafe { w.ep.trecv(&mut b, w.addr((r + n - 1) % n), i, 0, 7) });
        post(&w, || w.ep.tinject(&i.to_le_bytes(), w.addr((r + 1) % n), i));
        done(&w, 7);
        if u64::from_le_bytes(b) != i {
            fail(&w, format!("after barrier {i} the previous rank says {}", u64::from_le_bytes(b)));
        }
    }
    if r == 0 {
        println!(
            "barrier_storm: {n} ranks, {count} barriers, {:.1} us each",
            t0.elapsed().as_secs_f64() * 1e6 / count as f64
        );
    }
}
