//! Every rank sends every other rank messages of every protocol's size;
//! receivers check each byte and the order per source. `alltoall [ITERS]`
//! (default 3; `scripts/kill-trials.sh` runs it long and kills a rank).
use shmfab_mpi_tests::*;

const SIZES: [usize; 6] = [8, 1000, 5000, 20_000, 200_000, 1 << 20];

fn main() {
    let w = world();
    let (n, r) = (w.size, w.rank);
    let iters: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 3,
        Some(Ok(i)) if i > 0 => i,
        Some(_) => fail(&w, "usage: alltoall [ITERS], ITERS a positive integer"),
    };
    for iter in 0..iters {
        let mut bufs: Vec<Vec<u8>> = Vec::new();
        let mut ctxs = Vec::new();
        for q in (0..n).filter(|&q| q != r) {
            for (k, &len) in SIZES.iter().enumerate() {
                bufs.push(vec![0u8; len]);
                let b = bufs.last_mut().unwrap();
                let ctx = 1 + q * 100 + k;
                // SAFETY: bufs' inner buffers live until their completions.
                post(&w, || unsafe { w.ep.trecv(b, w.addr(q), (iter * 100 + k) as u64, 0, ctx) });
                ctxs.push((ctx, q, k, bufs.len() - 1));
            }
        }
        let data: Vec<(usize, usize, Vec<u8>)> = (0..n)
            .filter(|&q| q != r)
            .flat_map(|q| SIZES.iter().enumerate().map(move |(k, &len)| (q, k, payload(len, r, q, iter * 100 + k))))
            .collect();
        for (i, (q, k, d)) in data.iter().enumerate() {
            // SAFETY: data lives until the send completions below.
            post(&w, || unsafe { w.ep.tsend(d, w.addr(*q), (iter * 100 + k) as u64, 1_000_000 + i) });
        }
        for (ctx, q, k, bi) in ctxs {
            let e = done(&w, ctx);
            if e.len != SIZES[k] || bufs[bi] != payload(SIZES[k], q, r, iter * 100 + k) {
                fail(&w, format!("iteration {iter}: message {k} from rank {q} is wrong ({} bytes)", e.len));
            }
        }
        for i in 0..data.len() {
            done(&w, 1_000_000 + i);
        }
        w.barrier().unwrap_or_else(|e| fail(&w, e));
    }
    if r == 0 {
        println!("alltoall: {n} ranks, {} messages each, all bytes checked", iters * (n - 1) * SIZES.len());
    }
}
