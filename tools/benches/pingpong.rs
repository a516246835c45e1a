//! criterion benchmarks between two processes: the bench spawns itself as
//! the peer. Ping-pong half round-trip by size (the time criterion reports
//! per iteration is half a round trip), streaming bandwidth (windows of 64,
//! 16 from 1 MiB) and the 8-byte message rate (windows of 64, as osu_mbw_mr).

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use shmfab_tools::bench::{self, Link};
use std::cell::RefCell;
use std::time::Duration;

thread_local! {
    static LINK: RefCell<Option<Link>> = const { RefCell::new(None) };
}

fn with_link<R>(f: impl FnOnce(&mut Link) -> R) -> R {
    LINK.with(|l| {
        let mut l = l.borrow_mut();
        if l.is_none() {
            let exe = std::env::current_exe().expect("bench executable");
            *l = Some(Link::spawn(&exe, &[]).expect("start the benchmark peer"));
        }
        f(l.as_mut().unwrap())
    })
}

const SIZES: [usize; 7] = [8, 64, 1024, 4096, 65536, 1 << 20, 4 << 20];

fn pingpong(c: &mut Criterion) {
    let mut g = c.benchmark_group("pingpong_half_rtt");
    g.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
    for size in SIZES {
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter_custom(|n| with_link(|l| l.round_trips(size, n as usize).expect("ping-pong") / 2));
        });
    }
    g.finish();
}

fn bandwidth(c: &mut Criterion) {
    let mut g = c.benchmark_group("stream_bandwidth");
    g.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500)).sample_size(20);
    for size in [4096usize, 65536, 1 << 20, 4 << 20] {
        let w = Link::window_for(size);
        g.throughput(Throughput::Bytes((size * w) as u64));
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter_custom(|n| with_link(|l| l.windows(size, w, n as usize).expect("stream")));
        });
    }
    g.finish();
}

fn msgrate(c: &mut Criterion) {
    let mut g = c.benchmark_group("message_rate");
    g.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
    g.throughput(Throughput::Elements(64));
    g.bench_function("8B_window64", |b| {
        b.iter_custom(|n| with_link(|l| l.windows(8, 64, n as usize).expect("rate")));
    });
    g.finish();
}

criterion_group!(benches, pingpong, bandwidth, msgrate);

fn main() {
    if std::env::var_os(bench::PEER_ENV).is_some() {
        std::process::exit(bench::peer_main());
    }
    benches();
    if let Some(l) = LINK.with(|l| l.borrow_mut().take()) {
        l.quit().expect("peer exits cleanly");
    }
    criterion::Criterion::default().configure_from_args().final_summary();
}
