//! Software cost per message, in one process (two endpoints of one domain,
//! no cross-core traffic): what posting receives, injecting and one
//! progress pass plus the CQ read cost for windows of 64 eight-byte
//! messages. The two-process benchmarks add the cache-line transfers; this
//! one isolates the code path, and is far less noisy on shared VMs.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use shmfab::*;
use std::time::{Duration, Instant};

struct Pair {
    ep0: Endpoint,
    ep1: Endpoint,
    cq1: CompletionQueue,
    cq0: CompletionQueue,
    _av: AddressVector,
    _dom: Domain,
    a0: FiAddr,
    a1: FiAddr,
}

fn pair() -> Pair {
    std::env::set_var("SHMFAB_JOB_ID", format!("bench-costs-{}", std::process::id()));
    let dom = Fabric::open().unwrap().domain().unwrap();
    let cq0 = dom.cq_open(&CqAttr::default()).unwrap();
    let cq1 = dom.cq_open(&CqAttr::default()).unwrap();
    let av = dom.av_open().unwrap();
    let (ep0, ep1) = (dom.endpoint().unwrap(), dom.endpoint().unwrap());
    ep0.bind_cq(&cq0, FI_TRANSMIT | FI_RECV).unwrap();
    ep1.bind_cq(&cq1, FI_TRANSMIT | FI_RECV).unwrap();
    for e in [&ep0, &ep1] {
        e.bind_av(&av).unwrap();
        e.enable().unwrap();
    }
    let a = av.insert(&[ep0.getname(), ep1.getname()]).unwrap();
    Pair { ep0, ep1, cq1, cq0, _av: av, _dom: dom, a0: a[0], a1: a[1] }
}

fn costs(c: &mut Criterion) {
    let p = pair();
    let mut bufs = [[0u8; 8]; 64];
    let mut e = [CqTaggedEntry::default(); 16];
    let mut g = c.benchmark_group("per_message_in_process");
    g.measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(300));
    g.throughput(Throughput::Elements(64));
    // One window: post 64 directed tagged receives, inject 64, read 64.
    // Each stage timed on its own; criterion reports the stage's time per
    // window (divide by 64 for per message).
    for stage in ["post", "inject", "progress_and_read"] {
        g.bench_function(stage, |b| {
            b.iter_custom(|n| {
                let mut spent = Duration::ZERO;
                for _ in 0..n {
                    let t0 = Instant::now();
                    for b in bufs.iter_mut() {
                        // SAFETY: bufs outlive the completions read below.
                        unsafe { p.ep1.trecv(b, p.a0, 5, 0, 1).unwrap() };
                    }
                    let t1 = Instant::now();
                    for _ in 0..64 {
                        p.ep0.tinject(b"12345678", p.a1, 5).unwrap();
                    }
                    let t2 = Instant::now();
                    let mut got = 0;
                    while got < 64 {
                        if let Ok(k) = p.cq1.read(&mut e) {
                            got += k;
                        }
                    }
                    let t3 = Instant::now();
                    spent += match stage {
                        "post" => t1 - t0,
                        "inject" => t2 - t1,
                        _ => t3 - t2,
                    };
                }
                spent
            })
        });
    }
    g.finish();

    // The software on a ping-pong's critical path, without the cache-line
    // transfers: 64 half round trips in one thread (inject, then progress
    // and the CQ read that finds it, one way then back), receives posted
    // beforehand as the two-process ping-pong posts them off the path.
    let mut g = c.benchmark_group("half_round_trip_in_process");
    g.measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(300));
    g.throughput(Throughput::Elements(128));
    let mut back = [[0u8; 8]; 64];
    g.bench_function("8B", |b| {
        b.iter_custom(|n| {
            let mut spent = Duration::ZERO;
            for _ in 0..n {
                for (x, y) in bufs.iter_mut().zip(back.iter_mut()) {
                    // SAFETY: both arrays outlive the completions read below.
                    unsafe {
                        p.ep1.trecv(x, p.a0, 5, 0, 1).unwrap();
                        p.ep0.trecv(y, p.a1, 6, 0, 1).unwrap();
                    }
                }
                let t0 = Instant::now();
                for _ in 0..64 {
                    p.ep0.tinject(b"12345678", p.a1, 5).unwrap();
                    while !matches!(p.cq1.read(&mut e), Ok(1)) {}
                    p.ep1.tinject(b"87654321", p.a0, 6).unwrap();
                    while !matches!(p.cq0.read(&mut e), Ok(1)) {}
                }
                spent += t0.elapsed();
            }
            spent
        })
    });
    g.finish();
}

criterion_group!(benches, costs);
criterion_main!(benches);
