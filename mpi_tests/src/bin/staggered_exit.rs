//! Ranks send to rank 0 and leave at different times; rank 0 must still
//! get every message intact, including those of ranks already gone.
use shmfab_mpi_tests::*;

const SIZES: [usize; 4] = [8, 3000, 40_000, 300_000];

fn main() {
    let w = world();
    let (n, r) = (w.size, w.rank);
    if r == 0 {
        let mut bufs = Vec::new();
        for q in 1..n {
            for (k, &len) in SIZES.iter().enumerate() {
                bufs.push((q, k, vec![0u8; len]));
            }
        }
        for (i, (q, k, b)) in bufs.iter_mut().enumerate() {
            // SAFETY: the buffers live until their completions.
            post(&w, || unsafe { w.ep.trecv(b, w.addr(*q), *k as u64, 0, i + 1) });
        }
        w.barrier().unwrap_or_else(|e| fail(&w, e));
        for i in 0..bufs.len() {
            done(&w, i + 1);
        }
        for (q, k, b) in &bufs {
            if *b != payload(SIZES[*k], *q, 0, *k) {
                fail(&w, format!("message {k} from rank {q} is wrong"));
            }
        }
        println!("staggered_exit: {} messages from {} ranks that left at different times", bufs.len(), n - 1);
    } else {
        let data: Vec<Vec<u8>> = SIZES.iter().enumerate().map(|(k, &l)| payload(l, r, 0, k)).collect();
        w.barrier().unwrap_or_else(|e| fail(&w, e));
        std::thread::sleep(std::time::Duration::from_millis(30 * r as u64));
        for (k, d) in data.iter().enumerate() {
            // SAFETY: data lives until the completions below.
            post(&w, || unsafe { w.ep.tsend(d, w.addr(0), k as u64, 100 + k) });
        }
        for k in 0..SIZES.len() {
            done(&w, 100 + k);
        }
        // Leave at once: rank 0 may still be reading our inline messages.
    }
}
