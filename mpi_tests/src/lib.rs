//! Helpers for the multi-rank programs in `src/bin/`: each runs under
//! `mpirun -np N` or `shmfab run -n N`, joins the job with
//! [`shmfab::World`], checks what it receives, and exits non-zero (with a
//! message naming the rank) on any failure.

use shmfab::{CqTaggedEntry, World};

/// Joins the job or exits with a message.
pub fn world() -> World {
    match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("rank ?: cannot join the job: {e}");
            std::process::exit(2);
        }
    }
}

/// The completion of `ctx`, or exit naming the rank and the error.
pub fn done(w: &World, ctx: usize) -> CqTaggedEntry {
    match w.wait(ctx, None) {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            let text = w.cq.last_error_text().unwrap_or_default();
            eprintln!("rank {}: operation {ctx} failed: {text} ({e:?})", w.rank);
            std::process::exit(3);
        }
        Err(e) => {
            eprintln!("rank {}: waiting for {ctx}: {e}", w.rank);
            std::process::exit(3);
        }
    }
}

/// Retries a post on -FI_EAGAIN (driving progress), exits on other errors.
pub fn post(w: &World, mut f: impl FnMut() -> shmfab::Result<()>) {
    loop {
        match f() {
            Ok(()) => return,
            Err(e) if e.kind() == shmfab::ErrorKind::Again => {
                let _ = w.dom.progress();
                w.dom.wait(Some(std::time::Duration::from_micros(200)));
            }
            Err(e) => {
                eprintln!("rank {}: post failed: {e}", w.rank);
                std::process::exit(3);
            }
        }
    }
}

/// Deterministic payload for (from, to, k).
pub fn payload(len: usize, from: usize, to: usize, k: usize) -> Vec<u8> {
    let mut x = ((from as u64) << 40 | (to as u64) << 20 | k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Fails the rank with a message.
pub fn fail(w: &World, msg: impl std::fmt::Display) -> ! {
    eprintln!("rank {} of {}: {msg}", w.rank, w.size);
    std::process::exit(4);
}
