//! A token goes around the ring of ranks many times; each rank adds its
//! rank + 1; at the end rank 0 checks the sum.
use shmfab_mpi_tests::*;

fn main() {
    let w = world();
    let (n, r) = (w.size, w.rank);
    const ROUNDS: u64 = 200;
    let next = w.addr((r + 1) % n);
    let prev = w.addr((r + n - 1) % n);
    let mut token = 0u64;
    for round in 0..ROUNDS {
        let mut b = [0u8; 8];
        if r == 0 {
            post(&w, || w.ep.tinject(&token.to_le_bytes(), next, round));
            // SAFETY: b lives until the completion below.
            post(&w, || unsafe { w.ep.trecv(&mut b, prev, round, 0, 1) });
            done(&w, 1);
            token = u64::from_le_bytes(b);
        } else {
            // SAFETY: as above.
            post(&w, || unsafe { w.ep.trecv(&mut b, prev, round, 0, 1) });
            done(&w, 1);
            token = u64::from_le_bytes(b) + r as u64 + 1;
            post(&w, || w.ep.tinject(&token.to_le_bytes(), next, round));
        }
        if r == 0 {
            let per_round: u64 = (2..=n as u64).sum();
            if token != per_round * (round + 1) {
                fail(&w, format!("round {round}: token {token}, expected {}", per_round * (round + 1)));
            }
        }
    }
    w.barrier().unwrap_or_else(|e| fail(&w, e));
    if r == 0 {
        println!("ring: {n} ranks, {ROUNDS} rounds, token {token}");
    }
}
