//! Collectives built of deferred work (`shmfab::coll`): every collective,
//! every reduction op and type, on 2, 3, 4, 5 and 8 ranks, small sizes
//! (recursive doubling, dissemination) and large ones (ring), checked
//! against a serial reference; a collective that completes while every
//! rank only sleeps (auto progress); a rank killed in a collective gives
//! the others an error in bounded time.

mod common;
use common::{run, run_killing, World};
use shmfab::coll::RING_MIN;
use shmfab::{AtomicOp, AtomicType, CollAttr, CollGroup, ErrorKind};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(240);
const OPS: [AtomicOp; 4] = [AtomicOp::Sum, AtomicOp::Min, AtomicOp::Max, AtomicOp::Prod];
const TYPES: [AtomicType; 5] =
    [AtomicType::Int32, AtomicType::Int64, AtomicType::Uint64, AtomicType::Float, AtomicType::Double];

fn join(w: &World) -> CollGroup<'_> {
    let g = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &w.addrs, None, CollAttr::default()).unwrap();
    assert!(g.take_other_completions().is_empty());
    assert_eq!((g.rank(), g.size()), (w.rank, w.size));
    g
}

/// Element `i` of rank `r`'s input for `op`, as an exact small value:
/// sums and products of them are exact in every type (products: ±1 and
/// ±2 only, few of them).
fn val(op: AtomicOp, r: usize, i: usize) -> i64 {
    match op {
        AtomicOp::Prod => [1, -1, 2, 1, -2, 1, 1][(r * 3 + i) % 7],
        _ => ((r * 7 + i * 13) % 41) as i64 - 20,
    }
}

/// Encodes `v` as `dt` (unsigned: wrapping, as two's complement).
fn enc(dt: AtomicType, v: &[i64]) -> Vec<u8> {
    let mut out = Vec::new();
    for &x in v {
        match dt {
            AtomicType::Int32 => out.extend_from_slice(&(x as i32).to_ne_bytes()),
            AtomicType::Int64 => out.extend_from_slice(&x.to_ne_bytes()),
            AtomicType::Uint64 => out.extend_from_slice(&(x as u64).to_ne_bytes()),
            AtomicType::Float => out.extend_from_slice(&(x as f32).to_ne_bytes()),
            AtomicType::Double => out.extend_from_slice(&(x as f64).to_ne_bytes()),
            _ => unreachable!(),
        }
    }
    out
}

/// The serial reference: `op` over ranks 0..n of element `i`, in the
/// type's own arithmetic, encoded.
fn reference(dt: AtomicType, op: AtomicOp, n: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count {
        let xs: Vec<i64> = (0..n).map(|r| val(op, r, i)).collect();
        match dt {
            AtomicType::Uint64 => {
                let us = xs.iter().map(|&x| x as u64);
                let r = match op {
                    AtomicOp::Sum => us.fold(0u64, |a, b| a.wrapping_add(b)),
                    AtomicOp::Prod => us.fold(1u64, |a, b| a.wrapping_mul(b)),
                    AtomicOp::Min => us.min().unwrap(),
                    _ => us.max().unwrap(),
                };
                out.extend_from_slice(&r.to_ne_bytes());
            }
            _ => {
                let r = match op {
                    AtomicOp::Sum => xs.iter().sum(),
                    AtomicOp::Prod => xs.iter().product(),
                    AtomicOp::Min => *xs.iter().min().unwrap(),
                    _ => *xs.iter().max().unwrap(),
                };
                out.extend(enc(dt, &[r]));
            }
        }
    }
    out
}

fn input(dt: AtomicType, op: AtomicOp, r: usize, count: usize) -> Vec<u8> {
    enc(dt, &(0..count).map(|i| val(op, r, i)).collect::<Vec<_>>())
}

fn every(w: World) {
    let g = join(&w);
    let (n, me) = (w.size, w.rank);
    let tmo = Some(Duration::from_secs(60));
    for _ in 0..3 {
        g.wait(g.barrier().unwrap(), tmo).unwrap();
    }
    // Allreduce: every type and op, small (recursive doubling, a count
    // that is no power of two) and, for sum on every type and every op on
    // one type, large (ring: uneven chunks).
    for dt in TYPES {
        for op in OPS {
            let mut counts = vec![1, 7];
            if op == AtomicOp::Sum || dt == AtomicType::Int32 {
                counts.push(RING_MIN / dt.size() + 13);
            }
            for count in counts {
                let send = input(dt, op, me, count);
                let mut recv = vec![0u8; send.len()];
                // SAFETY: `recv` is left alone until the wait returns.
                let o = unsafe { g.allreduce(&send, &mut recv, dt, op).unwrap() };
                g.wait(o, tmo).unwrap();
                assert!(recv == reference(dt, op, n, count), "allreduce {dt:?} {op:?} x{count}");
            }
        }
    }
    // Reduce at the last rank, on every op of one type.
    for op in OPS {
        let send = input(AtomicType::Int64, op, me, 9);
        let mut recv = vec![0u8; if me == n - 1 { send.len() } else { 0 }];
        // SAFETY: as above.
        let o = unsafe { g.reduce(&send, &mut recv, n - 1, AtomicType::Int64, op).unwrap() };
        g.wait(o, tmo).unwrap();
        if me == n - 1 {
            assert!(recv == reference(AtomicType::Int64, op, n, 9), "reduce {op:?}");
        }
    }
    // Broadcast from rank 1 % n: odd sizes, small and large.
    for len in [1usize, 13, 3 * RING_MIN + 5] {
        let root = 1 % n;
        let want = common::pattern(len, 77);
        let mut buf = if me == root { want.clone() } else { vec![0xA5; len] };
        // SAFETY: as above.
        let o = unsafe { g.broadcast(&mut buf, root).unwrap() };
        g.wait(o, tmo).unwrap();
        assert!(buf == want, "broadcast of {len}");
    }
    // Allgather: Bruck (small) and ring (large).
    for b in [3usize, RING_MIN / n + 100] {
        let send = common::pattern(b, me as u64);
        let mut recv = vec![0u8; n * b];
        // SAFETY: as above.
        let o = unsafe { g.allgather(&send, &mut recv).unwrap() };
        g.wait(o, tmo).unwrap();
        for r in 0..n {
            assert!(recv[r * b..][..b] == common::pattern(b, r as u64)[..], "allgather {b}: block {r}");
        }
    }
    // Reduce-scatter on every type, sum and max, small and large blocks.
    for dt in TYPES {
        for op in [AtomicOp::Sum, AtomicOp::Max] {
            for bc in [2usize, RING_MIN / dt.size() / n + 3] {
                let send = input(dt, op, me, n * bc);
                let mut recv = vec![0u8; bc * dt.size()];
                // SAFETY: as above.
                let o = unsafe { g.reduce_scatter(&send, &mut recv, dt, op).unwrap() };
                g.wait(o, tmo).unwrap();
                let all = reference(dt, op, n, n * bc);
                assert!(recv[..] == all[me * bc * dt.size()..][..bc * dt.size()], "reduce_scatter {dt:?} {op:?} {bc}");
            }
        }
    }
    // Alltoall: block j of rank r says (r, j).
    for b in [8usize, 4096] {
        let send: Vec<u8> = (0..n).flat_map(|j| common::pattern(b, (me * 100 + j) as u64)).collect();
        let mut recv = vec![0u8; n * b];
        // SAFETY: as above.
        let o = unsafe { g.alltoall(&send, &mut recv).unwrap() };
        g.wait(o, tmo).unwrap();
        for r in 0..n {
            assert!(recv[r * b..][..b] == common::pattern(b, (r * 100 + me) as u64)[..], "alltoall {b} from {r}");
        }
    }
    // Back to back without waiting: posting the next waits for the last.
    let ops: Vec<_> = (0..20).map(|_| g.barrier().unwrap()).collect();
    g.wait(*ops.last().unwrap(), tmo).unwrap();
    assert!(ops.iter().all(|&o| g.test(o).unwrap()));
    assert_eq!(w.dom.queued_work().unwrap(), 0, "nothing left queued");
    drop(g);
    w.barrier();
}

#[test]
fn every_collective_on_2_ranks() {
    run("every_collective_on_2_ranks", 2, &[], T, every);
}

#[test]
fn every_collective_on_3_ranks() {
    run("every_collective_on_3_ranks", 3, &[], T, every);
}

#[test]
fn every_collective_on_4_ranks() {
    run("every_collective_on_4_ranks", 4, &[], T, every);
}

#[test]
fn every_collective_on_5_ranks() {
    run("every_collective_on_5_ranks", 5, &[], T, every);
}

#[test]
fn every_collective_on_8_ranks() {
    run("every_collective_on_8_ranks", 8, &[], T, every);
}

/// The same with auto progress: the thread fires the schedules while the
/// application posts and waits.
#[test]
fn every_collective_with_auto_progress_on_5_ranks() {
    run("every_collective_with_auto_progress_on_5_ranks", 5, &[("SHMFAB_THREADING", "safe")], T, |w| {
        w.dom.start_progress_thread().unwrap();
        every(w)
    });
}

/// Calls check their arguments: nothing queued, the group still usable.
fn args(w: World) {
    let g = join(&w);
    let mut r = vec![0u8; 8];
    // SAFETY: refused calls keep nothing.
    unsafe {
        let e = |x: shmfab::Result<_>| x.unwrap_err().kind();
        assert_eq!(e(g.allreduce(&[0; 8], &mut r[..4], AtomicType::Int32, AtomicOp::Sum)), ErrorKind::Inval);
        assert_eq!(e(g.allreduce(&[0; 6], &mut r[..6], AtomicType::Int32, AtomicOp::Sum)), ErrorKind::Inval);
        assert_eq!(e(g.allreduce(&[0; 8], &mut r, AtomicType::Float, AtomicOp::Bor)), ErrorKind::NoSys);
        assert_eq!(e(g.allreduce(&[0; 8], &mut r, AtomicType::Int32, AtomicOp::Cswap)), ErrorKind::NoSys);
        assert_eq!(e(g.broadcast(&mut r, 2)), ErrorKind::Inval);
        assert_eq!(e(g.allgather(&[0; 4], &mut r[..7])), ErrorKind::Inval);
        assert_eq!(e(g.alltoall(&[0; 3], &mut r[..3])), ErrorKind::Inval);
    }
    // More than one peer may write into a slot (the ring of 2 ranks sends
    // the whole vector each way): refused before anything is queued.
    let big = vec![0u8; CollAttr::default().slot_bytes + 64];
    let mut out = vec![0u8; big.len()];
    // SAFETY: refused.
    let e = unsafe { g.allreduce(&big, &mut out, AtomicType::Int64, AtomicOp::Sum) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::MsgSize);
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    g.wait(g.barrier().unwrap(), Some(Duration::from_secs(30))).unwrap();
    // A member list without us, or with a member twice.
    let other = [w.addrs[1 - w.rank]];
    let bad = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &other, None, CollAttr::default());
    assert_eq!(bad.err().unwrap().kind(), ErrorKind::Inval);
    let twice = [w.addrs[0], w.addrs[1], w.addrs[1]];
    let bad = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &twice, None, CollAttr::default());
    assert_eq!(bad.err().unwrap().kind(), ErrorKind::Inval);
}

#[test]
fn arguments_are_checked() {
    run("arguments_are_checked", 2, &[], T, args);
}

/// With auto progress, a posted allreduce (ring-sized, many steps) and a
/// counter bound at join complete while every rank only sleeps: the
/// results are in the buffers before any call is made.
fn auto(w: World) {
    w.dom.start_progress_thread().unwrap();
    let done = w.dom.cntr_open().unwrap();
    let g = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &w.addrs, Some(&done), CollAttr::default()).unwrap();
    let count = RING_MIN / 8 + 5;
    let send = input(AtomicType::Double, AtomicOp::Sum, w.rank, count);
    let mut recv = vec![0u8; send.len()];
    // SAFETY: `recv` is only read (volatile) until the wait below.
    let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Double, AtomicOp::Sum).unwrap() };
    let want = reference(AtomicType::Double, AtomicOp::Sum, w.size, count);
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: plain bytes, written by our progress thread: read
        // volatile, nothing here drives progress.
        let now: Vec<u8> = (0..recv.len()).map(|i| unsafe { std::ptr::read_volatile(recv.as_ptr().add(i)) }).collect();
        if now == want {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the allreduce did not complete on its own");
    }
    g.wait(o, Some(Duration::from_secs(10))).unwrap();
    assert_eq!(done.read().unwrap(), 1);
    drop(g);
    w.barrier();
}

#[test]
fn completes_while_the_application_sleeps() {
    run("completes_while_the_application_sleeps", 3, &[("SHMFAB_THREADING", "safe")], T, auto);
}

/// Rank 3 of 4 dies (SIGKILL) after the join, in the middle of a series
/// of allreduces: the others' wait fails with `Io` in bounded time.
fn killed(w: World) {
    let g = join(&w);
    let send = input(AtomicType::Int64, AtomicOp::Sum, w.rank, 1000);
    let mut recv = vec![0u8; send.len()];
    for i in 0..1000 {
        if w.rank == 3 && i == 5 {
            // SAFETY: ends this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        // SAFETY: as above.
        let o = match unsafe { g.allreduce(&send, &mut recv, AtomicType::Int64, AtomicOp::Sum) } {
            Ok(o) => o,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                break;
            }
        };
        let t0 = Instant::now();
        match g.wait(o, Some(Duration::from_secs(20))) {
            Ok(()) => assert!(i < 5, "allreduce {i} completed without rank 3"),
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                assert!(t0.elapsed() < Duration::from_secs(5), "noticed after {:?}", t0.elapsed());
                break;
            }
        }
    }
    // Broken for good, at once.
    let e = g.barrier().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io);
    assert_eq!(w.dom.queued_work().unwrap(), 0);
}

#[test]
fn a_killed_rank_fails_the_others() {
    run_killing("a_killed_rank_fails_the_others", 4, &[], T, &[3], killed);
}

/// `DeferredOp::Reduce`, the local compute step: it runs when its counter
/// reaches the threshold (not before), counts its completion counter,
/// and is checked at submission (lengths, op and type, overlap).
fn reduce_op(w: World) {
    use shmfab::{DeferredOp, DeferredWork};
    let (go, done) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
    let src: Vec<u8> = [5i32, -7, 9].iter().flat_map(|x| x.to_ne_bytes()).collect();
    let mut dst: Vec<u8> = [1i32, 2, 3].iter().flat_map(|x| x.to_ne_bytes()).collect();
    let w1 = DeferredWork {
        threshold: 2,
        triggering: &go,
        completion: Some(&done),
        op: DeferredOp::Reduce { dt: AtomicType::Int32, op: AtomicOp::Sum, src: &src, dst: &mut dst },
    };
    // SAFETY: both buffers outlive the work (checked below after it ran).
    unsafe { w.dom.queue_work(w1).unwrap() };
    go.add(1).unwrap();
    assert_eq!(done.read().unwrap(), 0);
    go.add(1).unwrap();
    assert_eq!(done.read().unwrap(), 1);
    let want: Vec<u8> = [6i32, -5, 12].iter().flat_map(|x| x.to_ne_bytes()).collect();
    assert_eq!(dst, want);
    let mut buf = vec![0u8; 16];
    let (a, b) = buf.split_at_mut(8);
    assert_eq!(refused(&w, &go, AtomicType::Float, AtomicOp::Bor, &a[..4], &mut b[..4]), ErrorKind::NoSys);
    assert_eq!(refused(&w, &go, AtomicType::Int32, AtomicOp::Sum, &a[..4], &mut b[..8]), ErrorKind::Inval);
    assert_eq!(refused(&w, &go, AtomicType::Int64, AtomicOp::Sum, &a[..4], &mut b[..4]), ErrorKind::Inval);
    let p = buf.as_mut_ptr();
    // SAFETY: two views of one buffer, only to be refused (never used).
    let (s, d) = unsafe { (std::slice::from_raw_parts(p, 8), std::slice::from_raw_parts_mut(p.add(4), 8)) };
    assert_eq!(refused(&w, &go, AtomicType::Int32, AtomicOp::Sum, s, d), ErrorKind::Inval);
    assert_eq!(w.dom.queued_work().unwrap(), 0);
}

/// The error of queueing a reduction that must be refused.
fn refused(w: &World, go: &shmfab::Counter, dt: AtomicType, op: AtomicOp, src: &[u8], dst: &mut [u8]) -> ErrorKind {
    use shmfab::{DeferredOp, DeferredWork};
    let wk =
        DeferredWork { threshold: 0, triggering: go, completion: None, op: DeferredOp::Reduce { dt, op, src, dst } };
    // SAFETY: refused at submission, so nothing keeps the buffers.
    unsafe { w.dom.queue_work(wk) }.unwrap_err().kind()
}

#[test]
fn the_reduce_op_of_deferred_work() {
    run("the_reduce_op_of_deferred_work", 1, &[], T, reduce_op);
}

/// Two groups on one endpoint, joined in different orders by the
/// processes they share: ranks 0 and 1 join {1, 0} first, then everyone;
/// rank 2 joins only everyone. Each works, alternately.
fn two_groups(w: World) {
    let tmo = Some(Duration::from_secs(60));
    let pair = [w.addrs[1], w.addrs[0]];
    let small =
        (w.rank < 2).then(|| CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &pair, None, CollAttr::default()).unwrap());
    let all = join(&w);
    for i in 0..10u64 {
        let send = (w.rank as u64 + i).to_ne_bytes();
        let mut out = [0u8; 8];
        // SAFETY: `out` is read after the wait.
        let o = unsafe { all.allreduce(&send, &mut out, AtomicType::Uint64, AtomicOp::Sum).unwrap() };
        all.wait(o, tmo).unwrap();
        assert_eq!(u64::from_ne_bytes(out), 3 + 3 * i);
        if let Some(g) = &small {
            assert_eq!(g.rank(), 1 - w.rank);
            // SAFETY: as above.
            let o = unsafe { g.allreduce(&send, &mut out, AtomicType::Uint64, AtomicOp::Max).unwrap() };
            g.wait(o, tmo).unwrap();
            assert_eq!(u64::from_ne_bytes(out), 1 + i);
        }
    }
    drop(small);
    drop(all);
    w.barrier();
}

#[test]
fn two_groups_on_one_endpoint() {
    run("two_groups_on_one_endpoint", 3, &[], T, two_groups);
}

/// A join whose other member never comes fails with `TimedOut` after
/// `join_timeout`; its receive is cancelled (an FI_ECANCELED error entry
/// at most, nothing else), and the endpoint works on.
fn lonely(w: World) {
    if w.rank == 0 {
        let attr = CollAttr { join_timeout: Duration::from_millis(300), ..Default::default() };
        let t0 = Instant::now();
        let e = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &w.addrs, None, attr).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
        assert!(t0.elapsed() >= Duration::from_millis(300));
        let mut ent = [shmfab::CqTaggedEntry::default(); 4];
        match w.cq.read(&mut ent) {
            Err(e) if e.kind() == ErrorKind::Again => {}
            Err(e) if e.kind() == ErrorKind::Avail => {
                let ee = w.cq.readerr().unwrap();
                assert_eq!(ee.err, libc::ECANCELED, "{ee:?}");
            }
            r => panic!("unexpected {r:?}"),
        }
    }
    w.barrier();
}

#[test]
fn a_join_without_the_others_times_out() {
    run("a_join_without_the_others_times_out", 2, &[], T, lonely);
}

/// Kept schedules (barrier, allreduce up to 4 KiB: built once per shape
/// and parity, re-armed in place at every instance), many times, with
/// shapes interleaved and more shapes than a group keeps (the oldest go),
/// each instance checked; a non-kept collective between them.
fn rearmed(w: World) {
    let g = join(&w);
    let n = w.size as i64;
    let tmo = Some(Duration::from_secs(60));
    for i in 0..300usize {
        match i % 5 {
            0 => g.wait(g.barrier().unwrap(), tmo).unwrap(),
            1 | 2 => {
                // 1 to 24 elements: 24 shapes (past the 16 kept), both parities.
                let count = 1 + (i * 7) % 24;
                let send: Vec<u8> = (0..count).flat_map(|k| ((w.rank * 3 + k + i) as i64).to_ne_bytes()).collect();
                let mut recv = vec![0u8; send.len()];
                // SAFETY: `recv` is read after the wait.
                let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Int64, AtomicOp::Sum) }.unwrap();
                g.wait(o, tmo).unwrap();
                for k in 0..count {
                    let want: i64 = (0..n).map(|r| r * 3 + (k + i) as i64).sum();
                    assert_eq!(i64::from_ne_bytes(recv[8 * k..][..8].try_into().unwrap()), want, "instance {i}");
                }
            }
            3 => {
                let send = ((w.rank + i) as f64).to_ne_bytes();
                let mut recv = [0u8; 8];
                // SAFETY: as above.
                let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Double, AtomicOp::Max) }.unwrap();
                g.wait(o, tmo).unwrap();
                assert_eq!(f64::from_ne_bytes(recv), (w.size - 1 + i) as f64, "instance {i}");
            }
            _ => {
                let send = [(w.rank + i) as u8; 3];
                let mut recv = vec![0u8; 3 * w.size];
                // SAFETY: as above.
                let o = unsafe { g.allgather(&send, &mut recv) }.unwrap();
                g.wait(o, tmo).unwrap();
                for r in 0..w.size {
                    assert_eq!(recv[3 * r..][..3], [(r + i) as u8; 3], "instance {i}");
                }
            }
        }
    }
    assert_eq!(w.dom.queued_work().unwrap(), 0);
}

#[test]
fn kept_schedules_rearmed_many_times_on_2_ranks() {
    run("kept_schedules_rearmed_many_times_on_2_ranks", 2, &[], T, rearmed);
}

#[test]
fn kept_schedules_rearmed_many_times_on_3_ranks() {
    run("kept_schedules_rearmed_many_times_on_3_ranks", 3, &[], T, rearmed);
}

/// Rank 2 of 3 dies in the middle of a series of kept barriers and small
/// allreduces (its peers' kept chains queued, waiting on its writes): the
/// others fail with `Io` in bounded time, their chains are off the queue,
/// and the group stays broken.
fn killed_kept(w: World) {
    let g = join(&w);
    for i in 0..1000 {
        if w.rank == 2 && i == 41 {
            // SAFETY: ends this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let send = (i as i64).to_ne_bytes();
        let mut recv = [0u8; 8];
        let posted = if i % 2 == 0 {
            g.barrier()
        } else {
            // SAFETY: `recv` outlives the wait (or the flush on failure).
            unsafe { g.allreduce(&send, &mut recv, AtomicType::Int64, AtomicOp::Sum) }
        };
        let o = match posted {
            Ok(o) => o,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                break;
            }
        };
        let t0 = Instant::now();
        match g.wait(o, Some(Duration::from_secs(20))) {
            Ok(()) => {
                assert!(i < 41, "collective {i} completed without rank 2");
                if i % 2 == 1 {
                    assert_eq!(i64::from_ne_bytes(recv), 3 * i as i64);
                }
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                assert!(t0.elapsed() < Duration::from_secs(5), "noticed after {:?}", t0.elapsed());
                break;
            }
        }
    }
    assert_eq!(g.barrier().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    // The kept schedules go with the group (their counters released).
    drop(g);
    assert_eq!(w.dom.queued_work().unwrap(), 0);
}

#[test]
fn a_killed_rank_fails_kept_schedules() {
    run_killing("a_killed_rank_fails_kept_schedules", 3, &[], T, &[2], killed_kept);
}

/// 2-member barriers and small allreduces take the direct path (the one
/// write at the post, completion seen by `test`/`wait`) unless a counter
/// was given at join or a progress thread runs: here rank 0 runs one (its
/// instances are deferred work) and rank 1 does not (direct), so the two
/// paths meet on the same slot regions and counters, instance after
/// instance, with both parities and non-kept collectives between; a
/// counter given at join on rank 1's second group is counted by each
/// instance (deferred work there too), every result checked.
fn mixed(w: World) {
    if w.rank == 0 {
        w.dom.start_progress_thread().unwrap();
    }
    let g = join(&w);
    let tmo = Some(Duration::from_secs(60));
    for i in 0..400usize {
        match i % 4 {
            0 => g.wait(g.barrier().unwrap(), tmo).unwrap(),
            1 => {
                let count = 1 + i % 9;
                let send: Vec<u8> = (0..count).flat_map(|k| ((w.rank * 5 + k + i) as f64).to_ne_bytes()).collect();
                let mut recv = vec![0u8; send.len()];
                // SAFETY: `recv` is read after the wait.
                let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Double, AtomicOp::Sum) }.unwrap();
                g.wait(o, tmo).unwrap();
                for k in 0..count {
                    let want = (5 + 2 * (k + i)) as f64;
                    assert_eq!(f64::from_ne_bytes(recv[8 * k..][..8].try_into().unwrap()), want, "instance {i}");
                }
            }
            2 => {
                let send = ((w.rank as i32 + 1) * (i as i32 % 7 + 1)).to_ne_bytes();
                let mut recv = [0u8; 4];
                // SAFETY: as above.
                let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Int32, AtomicOp::Prod) }.unwrap();
                // Completion found by `test` alone.
                let t0 = Instant::now();
                while !g.test(o).unwrap() {
                    assert!(t0.elapsed() < Duration::from_secs(60), "instance {i} never completed");
                    std::thread::yield_now();
                }
                let f = i as i32 % 7 + 1;
                assert_eq!(i32::from_ne_bytes(recv), 2 * f * f, "instance {i}");
            }
            _ => {
                let send = [(w.rank + i) as u8; 5];
                let mut recv = vec![0u8; 10];
                // SAFETY: as above.
                let o = unsafe { g.allgather(&send, &mut recv) }.unwrap();
                g.wait(o, tmo).unwrap();
                assert_eq!(recv[..5], [i as u8; 5], "instance {i}");
                assert_eq!(recv[5..], [(i + 1) as u8; 5], "instance {i}");
            }
        }
    }
    assert_eq!(w.dom.queued_work().unwrap(), 0);
    let done = w.dom.cntr_open().unwrap();
    let g2 = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &w.addrs, Some(&done), CollAttr::default()).unwrap();
    for i in 0..20u64 {
        g2.wait(g2.barrier().unwrap(), tmo).unwrap();
        assert_eq!(done.read().unwrap(), i + 1);
    }
    drop(g2);
    drop(g);
    w.barrier();
}

#[test]
fn direct_and_deferred_paths_meet_on_2_ranks() {
    run("direct_and_deferred_paths_meet_on_2_ranks", 2, &[("SHMFAB_THREADING", "safe")], T, mixed);
}

/// With a progress thread, a 2-member 8 B allreduce completes while both
/// ranks only sleep (it is deferred work, not the direct path).
fn auto_small(w: World) {
    w.dom.start_progress_thread().unwrap();
    let g = join(&w);
    let send = ((w.rank + 1) as i64).to_ne_bytes();
    let mut recv = [0u8; 8];
    // SAFETY: `recv` is only read (volatile) until the wait below.
    let o = unsafe { g.allreduce(&send, &mut recv, AtomicType::Int64, AtomicOp::Sum).unwrap() };
    let t0 = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: plain bytes written by our progress thread: read
        // volatile, nothing here drives progress.
        let now: [u8; 8] = unsafe { std::ptr::read_volatile(&recv) };
        if i64::from_ne_bytes(now) == 3 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the allreduce did not complete on its own");
    }
    g.wait(o, Some(Duration::from_secs(10))).unwrap();
    drop(g);
    w.barrier();
}

#[test]
fn a_small_allreduce_completes_while_2_ranks_sleep() {
    run("a_small_allreduce_completes_while_2_ranks_sleep", 2, &[("SHMFAB_THREADING", "safe")], T, auto_small);
}

/// Rank 1 of 2 dies in the middle of a series of direct-path barriers
/// and allreduces: rank 0's wait fails with `Io` in bounded time and the
/// group stays broken.
fn killed_direct(w: World) {
    let g = join(&w);
    for i in 0..100_000 {
        if w.rank == 1 && i == 3001 {
            // SAFETY: ends this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let send = (i as i64).to_ne_bytes();
        let mut recv = [0u8; 8];
        let posted = if i % 2 == 0 {
            g.barrier()
        } else {
            // SAFETY: `recv` outlives the wait.
            unsafe { g.allreduce(&send, &mut recv, AtomicType::Int64, AtomicOp::Sum) }
        };
        let o = match posted {
            Ok(o) => o,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                assert!(i >= 3001, "collective {i} failed: {e}");
                break;
            }
        };
        let t0 = Instant::now();
        match g.wait(o, Some(Duration::from_secs(20))) {
            Ok(()) => {
                assert!(i < 3001, "collective {i} completed without rank 1");
                if i % 2 == 1 {
                    assert_eq!(i64::from_ne_bytes(recv), 2 * i as i64);
                }
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                assert!(t0.elapsed() < Duration::from_secs(5), "noticed after {:?}", t0.elapsed());
                break;
            }
        }
    }
    assert_eq!(g.barrier().unwrap_err().kind(), ErrorKind::Io);
    assert_eq!(w.dom.queued_work().unwrap(), 0);
}

#[test]
fn a_killed_rank_fails_the_direct_path() {
    run_killing("a_killed_rank_fails_the_direct_path", 2, &[], T, &[1], killed_direct);
}

/// The direct path keeps the domain's threading contract: a group of a
/// Threading::Domain domain, moved to a thread that is not the domain's
/// owner, is refused there (`Inval`) as every other call of that domain
/// is; back with its owner it works. Two domains of one process, each
/// driven by its own thread.
#[test]
fn the_direct_path_refuses_a_thread_that_does_not_own_the_domain() {
    use shmfab::{CompletionQueue, CqAttr, Domain, Endpoint, Fabric, FI_RECV, FI_TRANSMIT};
    std::env::set_var("SHMFAB_JOB_ID", format!("coll-owner-{}", std::process::id()));
    let open = |d: &Domain| {
        let (cq, av, ep): (CompletionQueue, _, Endpoint) =
            (d.cq_open(&CqAttr::default()).unwrap(), d.av_open().unwrap(), d.endpoint().unwrap());
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
        (cq, av, ep)
    };
    let tmo = Some(Duration::from_secs(30));
    // Domain 1: this thread's (its owner from its first call on).
    let d1 = Fabric::open().unwrap().domain().unwrap();
    let (cq1, av1, ep1) = open(&d1);
    let (name_tx, name_rx) = std::sync::mpsc::channel();
    let (name1_tx, name1_rx) = std::sync::mpsc::channel();
    let (g_tx, g_rx) = std::sync::mpsc::channel::<CollGroup<'_>>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<CollGroup<'_>>();
    std::thread::scope(|s| {
        let h = s.spawn(move || {
            // Domain 0: this thread's.
            let d0 = Fabric::open().unwrap().domain().unwrap();
            let (cq0, av0, ep0) = open(&d0);
            name_tx.send(ep0.getname()).unwrap();
            let names = [ep0.getname(), name1_rx.recv().unwrap()];
            let a0 = av0.insert(&names).unwrap();
            let g0 = CollGroup::join(&d0, &ep0, &av0, &cq0, &a0, None, CollAttr::default()).unwrap();
            let b = g0.barrier().unwrap();
            g0.wait(b, tmo).unwrap();
            // Domain 1's group, here: refused, as another object of it is.
            let g1 = g_rx.recv().unwrap();
            assert_eq!(g1.barrier().err().map(|e| e.kind()), Some(ErrorKind::Inval), "a post from a non-owner");
            back_tx.send(g1).unwrap();
            let b = g0.barrier().unwrap();
            g0.wait(b, tmo).unwrap();
        });
        let n0 = name_rx.recv().unwrap();
        name1_tx.send(ep1.getname()).unwrap();
        let a1 = av1.insert(&[n0, ep1.getname()]).unwrap();
        let g1 = CollGroup::join(&d1, &ep1, &av1, &cq1, &a1, None, CollAttr::default()).unwrap();
        let b = g1.barrier().unwrap();
        g1.wait(b, tmo).unwrap();
        g_tx.send(g1).unwrap();
        let g1 = back_rx.recv().unwrap();
        // Back with its owner, it works.
        let b = g1.barrier().unwrap();
        g1.wait(b, tmo).unwrap();
        drop(g1);
        h.join().unwrap();
    });
}
