//! The doorbell across processes: a receiver that sleeps on its domain's
//! futex (with the signaller's fence replaced by the waiter's membarrier
//! where the kernel offers it) is woken by every message; a lost wake-up
//! shows as a wait that runs to its 10 s timeout, which fails the test.

mod common;
use common::{run, World};
use std::time::{Duration, Instant};

fn sleepy_receiver(w: &World, n: usize) {
    let mut b = [0u8; 8];
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        // SAFETY: b lives until the completion below.
        unsafe { w.ep.recv(&mut b, w.addrs[0], i).unwrap() };
        let t0 = Instant::now();
        loop {
            let mut e = [shmfab::CqTaggedEntry::default()];
            if w.cq.read(&mut e).is_ok() {
                assert_eq!(e[0].op_context, i);
                break;
            }
            // Sleep until the doorbell rings; no busy polling at all.
            w.dom.wait(Some(Duration::from_secs(10)));
            assert!(t0.elapsed() < Duration::from_secs(5), "message {i}: wake-up lost (waited {:?})", t0.elapsed());
        }
        slowest = slowest.max(t0.elapsed());
        assert_eq!(u64::from_le_bytes(b), i as u64);
    }
    let sleeps = w.dom.sleeps();
    eprintln!("slowest wait: {slowest:?}, {sleeps} sleeps");
    assert!(sleeps as usize > n / 20, "the receiver must really sleep: {sleeps} sleeps for {n} messages");
}

fn sender(w: &World, n: usize) {
    let mut x = 12345u64;
    for i in 0..n {
        // Random gaps, so the receiver is caught in every phase of going to
        // sleep: checking, announced, asleep.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let gap = x % 300;
        if gap > 200 {
            std::thread::sleep(Duration::from_micros(gap - 200));
        } else {
            for _ in 0..gap * 10 {
                std::hint::spin_loop();
            }
        }
        w.retry(|| w.ep.inject(&(i as u64).to_le_bytes(), w.addrs[1]));
    }
}

#[test]
fn sleeping_receiver_is_woken_by_every_message() {
    run("sleeping_receiver_is_woken_by_every_message", 2, &[], Duration::from_secs(120), |w| {
        const N: usize = 20_000;
        if w.rank == 1 {
            sleepy_receiver(&w, N);
        } else {
            sender(&w, N);
        }
        w.barrier();
    });
}

#[test]
fn sleeping_receiver_is_woken_without_membarrier() {
    // The symmetric protocol (fence on both sides), as on kernels without
    // membarrier.
    let env = [("SHMFAB_NO_MEMBARRIER", "1")];
    run("sleeping_receiver_is_woken_without_membarrier", 2, &env, Duration::from_secs(120), |w| {
        const N: usize = 5_000;
        if w.rank == 1 {
            sleepy_receiver(&w, N);
        } else {
            sender(&w, N);
        }
        w.barrier();
    });
}
