//! Collective latency: barrier and f64-sum allreduce (8 B, 1 KiB, 1 MiB by
//! default) through `shmfab::CollGroup`, as OSU's osu_barrier /
//! osu_allreduce measure them: each rank times `iters` back-to-back
//! post-and-wait; the figure is the mean over ranks of each rank's mean.
//! Then the overlap of a 1 MiB allreduce with the application's own
//! computation (post, compute for the allreduce's measured time, wait).
//!
//! ```text
//! cargo build --release --example coll_bench
//! shmfab run -n 4 -- target/release/examples/coll_bench [--iters N] [--sizes 8,1k,1m] [--auto] [--no-overlap]
//! ```
//! `--auto` starts the auto-progress thread (set SHMFAB_THREADING=safe);
//! `--no-overlap` leaves the overlap figure out (`shmfab compare --only
//! coll` runs it so).
//! Output: one line per figure, `barrier ranks=N latency_us=...` (with
//! the median, and the median time in the posting call) and
//! `allreduce ranks=N size=S latency_us=... median_us=...`, printed by
//! rank 0 (each a mean over ranks of the rank's figure).
//!
//! `coll_bench --inproc N [--allreduce]` instead runs N barriers (or 8 B
//! allreduces) between two groups of one process (two domains, as two
//! ranks would have; one thread posts on both, then waits on the first):
//! the software of a 2-rank collective without the cache-line transfers,
//! for callgrind (`valgrind --tool=callgrind ... --inproc 20000`: divide
//! by N for the instructions of one collective at both ranks).

use shmfab::{AtomicOp, AtomicType, CollAttr, CollGroup, World};
use std::time::{Duration, Instant};

mod common;
use common::size_arg;

/// Mean over ranks of `v` (each rank's figure), at rank 0.
fn mean_over_ranks(w: &World, g: &CollGroup<'_>, v: f64) -> f64 {
    let send = v.to_ne_bytes();
    let mut out = [0u8; 8];
    // SAFETY: `out` is read after the wait.
    let o = unsafe { g.allreduce(&send, &mut out, AtomicType::Double, AtomicOp::Sum).unwrap() };
    g.wait(o, Some(Duration::from_secs(60))).unwrap();
    f64::from_ne_bytes(out) / w.size as f64
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// The median: on a shared VM a rare preempted iteration (a time slice,
/// milliseconds) moves the mean of thousands.
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `--inproc`: see the module docs.
fn inproc(n: usize, allreduce: bool) {
    use shmfab::{CqAttr, Fabric, FI_RECV, FI_TRANSMIT};
    std::env::set_var("SHMFAB_JOB_ID", format!("coll-inproc-{}", std::process::id()));
    let fab = Fabric::open().unwrap();
    // SAFETY: each domain's calls are made by one thread at a time (the
    // joins in two threads, then everything in this one).
    let d = unsafe { [fab.domain_serialized().unwrap(), fab.domain_serialized().unwrap()] };
    let cq = [d[0].cq_open(&CqAttr::default()).unwrap(), d[1].cq_open(&CqAttr::default()).unwrap()];
    let av = [d[0].av_open().unwrap(), d[1].av_open().unwrap()];
    let ep = [d[0].endpoint().unwrap(), d[1].endpoint().unwrap()];
    for i in 0..2 {
        ep[i].bind_cq(&cq[i], FI_TRANSMIT | FI_RECV).unwrap();
        ep[i].bind_av(&av[i]).unwrap();
        ep[i].enable().unwrap();
    }
    let names = [ep[0].getname(), ep[1].getname()];
    let addrs: Vec<Vec<u64>> = (0..2).map(|i| av[i].insert(&names).unwrap()).collect();
    let attr = CollAttr { slot_bytes: 4096, ..Default::default() };
    let (g0, g1) = std::thread::scope(|s| {
        let (d, ep, av, cq, addrs) = (&d, &ep, &av, &cq, &addrs);
        let h = s.spawn(move || CollGroup::join(&d[1], &ep[1], &av[1], &cq[1], &addrs[1], None, attr).unwrap());
        let g0 = CollGroup::join(&d[0], &ep[0], &av[0], &cq[0], &addrs[0], None, attr).unwrap();
        (g0, h.join().unwrap())
    });
    let tmo = Some(Duration::from_secs(60));
    let send = 3f64.to_ne_bytes();
    let (mut r0, mut r1) = ([0u8; 8], [0u8; 8]);
    let t = Instant::now();
    for _ in 0..n {
        let (o0, o1) = if allreduce {
            // SAFETY: the results are read after the waits.
            unsafe {
                (
                    g0.allreduce(&send, &mut r0, AtomicType::Double, AtomicOp::Sum).unwrap(),
                    g1.allreduce(&send, &mut r1, AtomicType::Double, AtomicOp::Sum).unwrap(),
                )
            }
        } else {
            (g0.barrier().unwrap(), g1.barrier().unwrap())
        };
        g0.wait(o0, tmo).unwrap();
        g1.wait(o1, tmo).unwrap();
    }
    if allreduce {
        assert_eq!((f64::from_ne_bytes(r0), f64::from_ne_bytes(r1)), (6.0, 6.0), "allreduce result");
    }
    let what = if allreduce { "allreduce 8 B" } else { "barrier" };
    println!("inproc {what}: {n} at both ranks, {:.3} us each", t.elapsed().as_secs_f64() * 1e6 / n as f64);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).is_some_and(|a| a == "--inproc") {
        let n = args.get(2).map_or(20000, |a| a.parse().expect("a count"));
        return inproc(n, args.iter().any(|a| a == "--allreduce"));
    }
    let mut iters = 2000usize;
    let mut sizes = vec![8usize, 1024, 1 << 20];
    let mut auto = false;
    let mut overlap = true;
    let mut i = 1;
    while i < args.len() {
        match args[i].as_str() {
            "--iters" => {
                iters = args[i + 1].parse().unwrap();
                i += 1;
            }
            "--sizes" => {
                sizes = args[i + 1].split(',').map(size_arg).collect();
                i += 1;
            }
            "--auto" => auto = true,
            "--no-overlap" => overlap = false,
            a => panic!("unknown argument {a}"),
        }
        i += 1;
    }
    let w = World::init().expect("run under shmfab run or mpirun");
    if auto {
        w.dom.start_progress_thread().expect("--auto needs SHMFAB_THREADING=safe");
    }
    let addrs: Vec<u64> = (0..w.size).map(|r| w.addr(r)).collect();
    let big = sizes.iter().copied().max().unwrap_or(8);
    let attr = CollAttr { slot_bytes: (2 * big + 4096).max(CollAttr::default().slot_bytes), ..Default::default() };
    let g = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &addrs, None, attr).unwrap();
    let tmo = Some(Duration::from_secs(120));

    // Barrier.
    for _ in 0..iters / 10 {
        g.wait(g.barrier().unwrap(), tmo).unwrap();
    }
    let mut lat = Vec::with_capacity(iters);
    let mut post = Vec::with_capacity(iters);
    for _ in 0..iters {
        let p = Instant::now();
        let o = g.barrier().unwrap();
        post.push(p.elapsed().as_secs_f64() * 1e6);
        g.wait(o, tmo).unwrap();
        lat.push(p.elapsed().as_secs_f64() * 1e6);
    }
    let (m, p50) = (mean_over_ranks(&w, &g, mean(&lat)), mean_over_ranks(&w, &g, median(&mut lat)));
    let pm = mean_over_ranks(&w, &g, median(&mut post));
    if w.rank == 0 {
        println!("barrier ranks={} latency_us={m:.3} median_us={p50:.3} post_median_us={pm:.3}", w.size);
    }

    let mut at_big = None;
    for &size in &sizes {
        let n = size.div_ceil(8);
        let send: Vec<u8> = (0..n).flat_map(|k| ((k % 17) as f64).to_ne_bytes()).collect();
        let mut recv = vec![0u8; send.len()];
        let it = if size >= 1 << 20 { (iters / 40).max(20) } else { iters };
        for _ in 0..it / 10 + 1 {
            // SAFETY: `recv` is left alone until the wait.
            let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Double, AtomicOp::Sum).unwrap() };
            g.wait(o, tmo).unwrap();
        }
        let mut lat = Vec::with_capacity(it);
        for _ in 0..it {
            let t = Instant::now();
            // SAFETY: as above.
            let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Double, AtomicOp::Sum).unwrap() };
            g.wait(o, tmo).unwrap();
            lat.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let us = mean(&lat);
        let p50 = median(&mut lat);
        let want = (0..n)
            .all(|k| f64::from_ne_bytes(recv[8 * k..][..8].try_into().unwrap()) == (k % 17) as f64 * w.size as f64);
        assert!(want, "allreduce result");
        let (m, p50) = (mean_over_ranks(&w, &g, us), mean_over_ranks(&w, &g, p50));
        if w.rank == 0 {
            println!("allreduce ranks={} size={} latency_us={m:.3} median_us={p50:.3}", w.size, n * 8);
        }
        if size >= 1 << 20 {
            at_big = Some((send, recv, us, it));
        }
    }

    // Overlap (as OSU's non-blocking collectives measure it): post, compute
    // for the pure time, wait; overlap = 1 - (total - compute) / pure.
    if let Some((send, mut recv, pure, it)) = at_big.filter(|_| overlap) {
        let spin = Duration::from_secs_f64(pure / 1e6);
        let it = it.min(50);
        let t0 = Instant::now();
        for _ in 0..it {
            // SAFETY: as above.
            let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Double, AtomicOp::Sum).unwrap() };
            let c = Instant::now();
            let mut x = 0u64;
            while c.elapsed() < spin {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            g.wait(o, tmo).unwrap();
        }
        let total = t0.elapsed().as_secs_f64() * 1e6 / it as f64;
        let ov = (1.0 - (total - pure) / pure).clamp(0.0, 1.0) * 100.0;
        let m = mean_over_ranks(&w, &g, ov);
        if w.rank == 0 {
            println!(
                "allreduce-overlap ranks={} size={} pure_us={pure:.1} total_us={total:.1} overlap_pct={m:.0} auto={auto}",
                w.size,
                send.len()
            );
        }
    }
    drop(g);
    w.barrier().unwrap();
}
