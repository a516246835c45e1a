//! Probe (not a benchmark of shmfab's API): where the cross-process 8 B
//! half round trip goes. Two processes (fork) over one shared mapping:
//! `raw` ping-pongs one word per direction on its own line; `ring` sends
//! 8 B messages through shmfab's SPSC ring code (RingTx/RingRx, two rings);
//! `ring+W` adds W iterations of dependent integer work per empty poll
//! and after each message found (a stand-in for the engine's software).
//! Prints medians of alternating rounds in microseconds per half trip.
//! `SHMFAB_RING_LAP=N` makes the rings take lap ends from cell N as the
//! engine's do (default here 0: none, each message in the next cells).
//!
//! Usage: `ringprobe [rounds] [W...]` (default 7 rounds, W 0 20 60).

use shm_layout::{Cell, MsgHdr, RingCtl};
use shmfab::internal::ring::{RingRx, RingTx};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const CELLS: usize = 256;
const ITERS: u64 = 200_000;

#[repr(C, align(4096))]
struct Shared {
    ping: [AtomicU64; 8],
    pong: [AtomicU64; 8],
    go: [AtomicU64; 8],
    ctl: [RingCtl; 2],
    cells: [[Cell; CELLS]; 2],
}

#[inline(never)]
fn work(n: u64) -> u64 {
    let mut x = black_box(1u64);
    for i in 0..n {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(i);
    }
    black_box(x)
}

fn raw(s: &Shared, me: usize) -> f64 {
    let (mine, theirs) = if me == 0 { (&s.ping[0], &s.pong[0]) } else { (&s.pong[0], &s.ping[0]) };
    let base = mine.load(Ordering::Relaxed);
    let t0 = Instant::now();
    for i in 1..=ITERS {
        if me == 0 {
            mine.store(base + i, Ordering::Release);
            while theirs.load(Ordering::Acquire) != base + i {
                std::hint::spin_loop();
            }
        } else {
            while theirs.load(Ordering::Acquire) != base + i {
                std::hint::spin_loop();
            }
            mine.store(base + i, Ordering::Release);
        }
    }
    t0.elapsed().as_secs_f64() * 1e6 / (2 * ITERS) as f64
}

fn ring(tx: &mut RingTx, rx: &mut RingRx, me: usize, w: u64, pause: bool) -> f64 {
    let hdr = MsgHdr { op: 1, len: 8, ..Default::default() };
    let mut out = [0u8; 8];
    let t0 = Instant::now();
    let mut recv = |rx: &mut RingRx| loop {
        if let Some((_, n)) = rx.peek() {
            rx.read_payload(0, &mut out);
            rx.consume(n, false);
            rx.release_credit();
            work(w);
            return;
        }
        work(w);
        if pause {
            std::hint::spin_loop();
        }
    };
    for _ in 0..ITERS {
        if me == 0 {
            while !tx.try_push_one(&hdr, b"12345678") {}
            recv(rx);
            // As the engine does: a push that answers claims no line ahead.
            tx.heard_back();
        } else {
            recv(rx);
            tx.heard_back();
            while !tx.try_push_one(&hdr, b"12345678") {}
        }
    }
    t0.elapsed().as_secs_f64() * 1e6 / (2 * ITERS) as f64
}

fn main() {
    let rounds: usize = std::env::args().nth(1).map_or(7, |a| a.parse().unwrap());
    let ws: Vec<u64> = std::env::args().skip(2).map(|a| a.parse().unwrap()).collect();
    let ws = if ws.is_empty() { vec![0, 20, 60] } else { ws };
    // Lap ends as the engine's rings take them (crate::ring), from this
    // cell on; 0 (the default here): none, the whole ring.
    let lap: usize = std::env::var("SHMFAB_RING_LAP").map_or(0, |v| v.parse().expect("SHMFAB_RING_LAP: cells"));
    let size = std::mem::size_of::<Shared>();
    // SAFETY: anonymous shared mapping, checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: zeroed shared memory is a valid Shared (atomics, zeroed cells).
    let s: &Shared = unsafe { &*(p as *const Shared) };
    // SAFETY: fork in a single-threaded process.
    let pid = unsafe { libc::fork() };
    let me = if pid == 0 { 1 } else { 0 };
    let cells = |i: usize| s.cells[i].as_ptr() as *mut u8;
    // Ring 0 carries 0 -> 1, ring 1 carries 1 -> 0.
    // SAFETY: the rings live in the mapping for the process's life; one
    // producer and one consumer each.
    let (tx, mut rx) = unsafe {
        if me == 0 {
            (RingTx::new(&s.ctl[0], cells(0), CELLS), RingRx::new(&s.ctl[1], cells(1), CELLS))
        } else {
            (RingTx::new(&s.ctl[1], cells(1), CELLS), RingRx::new(&s.ctl[0], cells(0), CELLS))
        }
    };
    let mut tx = tx.lap_from(lap);
    let mut res: Vec<Vec<f64>> = vec![Vec::new(); 1 + 2 * ws.len()];
    for _ in 0..rounds {
        res[0].push(raw(s, me));
        for (k, &w) in ws.iter().enumerate() {
            res[1 + 2 * k].push(ring(&mut tx, &mut rx, me, w, false));
            res[2 + 2 * k].push(ring(&mut tx, &mut rx, me, w, true));
        }
    }
    if me == 0 {
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.partial_cmp(b).unwrap());
            v[v.len() / 2]
        };
        println!("raw        {:.4}", med(&mut res[0]));
        for (k, &w) in ws.iter().enumerate() {
            println!("ring+{w:<4}   {:.4}   (with pause {:.4})", med(&mut res[1 + 2 * k]), med(&mut res[2 + 2 * k]));
        }
        // SAFETY: waiting for our child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
}
