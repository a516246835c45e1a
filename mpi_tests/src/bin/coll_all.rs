//! Every collective of `shmfab::coll` over all ranks of the job: barrier,
//! broadcast (from every root), reduce (every op at a rotating root),
//! allreduce (every op on every type it takes, small: recursive doubling,
//! and large: ring), allgather, reduce_scatter and alltoall, each result
//! checked exactly (floats too: the inputs are small integers, so every
//! order of summing gives one value) against a serial reference; the
//! reductions the library refuses are refused with `NoSys`.
use shmfab::coll::RING_MIN;
use shmfab::{AtomicOp, AtomicType, CollAttr, CollGroup, ErrorKind, World};
use shmfab_mpi_tests::*;
use std::time::Duration;

const INTS: [AtomicType; 8] = [
    AtomicType::Int8,
    AtomicType::Uint8,
    AtomicType::Int16,
    AtomicType::Uint16,
    AtomicType::Int32,
    AtomicType::Uint32,
    AtomicType::Int64,
    AtomicType::Uint64,
];
const FLOATS: [AtomicType; 2] = [AtomicType::Float, AtomicType::Double];
const ARITH: [AtomicOp; 4] = [AtomicOp::Sum, AtomicOp::Prod, AtomicOp::Min, AtomicOp::Max];
const BITS: [AtomicOp; 3] = [AtomicOp::Bor, AtomicOp::Band, AtomicOp::Bxor];
const TMO: Option<Duration> = Some(Duration::from_secs(60));

fn types() -> impl Iterator<Item = AtomicType> {
    INTS.into_iter().chain(FLOATS)
}

/// Every (type, op) pair the collectives reduce with.
fn pairs() -> Vec<(AtomicType, AtomicOp)> {
    let mut v: Vec<_> = types().flat_map(|t| ARITH.map(|o| (t, o))).collect();
    v.extend(INTS.into_iter().flat_map(|t| BITS.map(|o| (t, o))));
    v
}

/// Element `i` of rank `r`'s input for `op`: small integers for the
/// arithmetic (products: ±1 and ±2 only, few of them, so exact in
/// every type), 16-bit patterns for the bit operations.
fn val(op: AtomicOp, r: usize, i: usize) -> i64 {
    match op {
        AtomicOp::Prod => [1, -1, 2, 1, -2, 1, 1][(r * 3 + i) % 7],
        AtomicOp::Bor | AtomicOp::Band | AtomicOp::Bxor => ((r * 40503 + i * 2654435761) % 65536) as i64 - 32768,
        _ => ((r * 7 + i * 13) % 41) as i64 - 20,
    }
}

fn signed(dt: AtomicType) -> bool {
    matches!(dt, AtomicType::Int8 | AtomicType::Int16 | AtomicType::Int32 | AtomicType::Int64)
}

/// `x` as a value of `dt` (integers: truncated, as two's complement).
fn enc(dt: AtomicType, x: i64) -> Vec<u8> {
    match dt {
        AtomicType::Float => (x as f32).to_ne_bytes().to_vec(),
        AtomicType::Double => (x as f64).to_ne_bytes().to_vec(),
        _ => x.to_ne_bytes()[..dt.size()].to_vec(),
    }
}

/// `x` truncated to `dt`'s width and read back in its order (for min and
/// max on integers).
fn canon(dt: AtomicType, x: i64) -> i128 {
    let bits = dt.size() * 8;
    if bits == 64 {
        return if signed(dt) { x as i128 } else { x as u64 as i128 };
    }
    let u = (x as u64) & ((1u64 << bits) - 1);
    if signed(dt) && u >> (bits - 1) == 1 {
        u as i128 - (1i128 << bits)
    } else {
        u as i128
    }
}

fn input(dt: AtomicType, op: AtomicOp, r: usize, count: usize) -> Vec<u8> {
    (0..count).flat_map(|i| enc(dt, val(op, r, i))).collect()
}

/// The serial reference: `op` over ranks 0..n of each element, in `dt`'s
/// own arithmetic (integer sums, products and bit operations commute
/// with truncation, so they are folded in i64 and truncated once).
fn reference(dt: AtomicType, op: AtomicOp, n: usize, count: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..count {
        let xs: Vec<i64> = (0..n).map(|r| val(op, r, i)).collect();
        let float = FLOATS.contains(&dt);
        let v = match op {
            AtomicOp::Sum => xs.iter().fold(0i64, |a, &b| a.wrapping_add(b)),
            AtomicOp::Prod => xs.iter().fold(1i64, |a, &b| a.wrapping_mul(b)),
            AtomicOp::Bor => xs.iter().fold(0, |a, &b| a | b),
            AtomicOp::Band => xs.iter().fold(-1, |a, &b| a & b),
            AtomicOp::Bxor => xs.iter().fold(0, |a, &b| a ^ b),
            AtomicOp::Min if float => *xs.iter().min().unwrap(),
            AtomicOp::Max if float => *xs.iter().max().unwrap(),
            AtomicOp::Min => xs.iter().map(|&x| canon(dt, x)).min().unwrap() as i64,
            AtomicOp::Max => xs.iter().map(|&x| canon(dt, x)).max().unwrap() as i64,
            _ => unreachable!(),
        };
        out.extend(enc(dt, v));
    }
    out
}

fn check(w: &World, what: &str, ok: bool) {
    if !ok {
        fail(w, format!("{what}: wrong result"));
    }
}

fn wait(w: &World, g: &CollGroup, what: &str, r: shmfab::Result<shmfab::CollOp>) {
    let op = r.unwrap_or_else(|e| fail(w, format!("{what}: post: {e}")));
    g.wait(op, TMO).unwrap_or_else(|e| fail(w, format!("{what}: wait: {e}")));
}

fn main() {
    let w = world();
    let (n, me) = (w.size, w.rank);
    let members: Vec<_> = (0..n).map(|r| w.addr(r)).collect();
    let g = CollGroup::join(&w.dom, &w.ep, &w.av, &w.cq, &members, None, CollAttr::default())
        .unwrap_or_else(|e| fail(&w, format!("join: {e}")));
    if (g.rank(), g.size()) != (me, n) {
        fail(&w, format!("group says rank {} of {}", g.rank(), g.size()));
    }
    let t0 = std::time::Instant::now();
    let mut count = 0usize;
    for _ in 0..5 {
        wait(&w, &g, "barrier", g.barrier());
    }
    // Allreduce: every type and op, counts no power of two; large (ring,
    // uneven chunks) for sum on every type and every op on Int32.
    for (dt, op) in pairs() {
        let mut counts = vec![1, 7];
        if op == AtomicOp::Sum || dt == AtomicType::Int32 {
            counts.push(RING_MIN / dt.size() + 13);
        }
        for c in counts {
            let what = format!("allreduce {dt:?} {op:?} x{c}");
            let send = input(dt, op, me, c);
            let mut recv = vec![0u8; send.len()];
            // SAFETY: `recv` is left alone until the wait returns.
            wait(&w, &g, &what, unsafe { g.allreduce(&send, &mut recv, dt, op) });
            check(&w, &what, recv == reference(dt, op, n, c));
            count += 1;
        }
    }
    // Reduce: every type and op, the root moving round the ranks.
    for (k, (dt, op)) in pairs().into_iter().enumerate() {
        let root = k % n;
        let what = format!("reduce {dt:?} {op:?} at {root}");
        let send = input(dt, op, me, 9);
        let mut recv = vec![0u8; if me == root { send.len() } else { 0 }];
        // SAFETY: as above.
        wait(&w, &g, &what, unsafe { g.reduce(&send, &mut recv, root, dt, op) });
        if me == root {
            check(&w, &what, recv == reference(dt, op, n, 9));
        }
        count += 1;
    }
    // Broadcast from every root, small and large (ring) odd sizes.
    for root in 0..n {
        for len in [1usize, 13, 3 * RING_MIN + 5] {
            let what = format!("broadcast {len} from {root}");
            let want = payload(len, root, 0, len);
            let mut buf = if me == root { want.clone() } else { vec![0xA5; len] };
            // SAFETY: as above.
            wait(&w, &g, &what, unsafe { g.broadcast(&mut buf, root) });
            check(&w, &what, buf == want);
            count += 1;
        }
    }
    // Allgather: Bruck (small) and ring (large).
    for b in [3usize, 64, RING_MIN / n + 100] {
        let what = format!("allgather {b}");
        let send = payload(b, me, 0, b);
        let mut recv = vec![0u8; n * b];
        // SAFETY: as above.
        wait(&w, &g, &what, unsafe { g.allgather(&send, &mut recv) });
        check(&w, &what, (0..n).all(|r| recv[r * b..][..b] == payload(b, r, 0, b)[..]));
        count += 1;
    }
    // Reduce-scatter: every type and op, small and large blocks.
    for (dt, op) in pairs() {
        let mut blocks = vec![2usize];
        if op == AtomicOp::Sum || op == AtomicOp::Bxor {
            blocks.push(RING_MIN / dt.size() / n + 3);
        }
        for bc in blocks {
            let what = format!("reduce_scatter {dt:?} {op:?} {bc}/rank");
            let send = input(dt, op, me, n * bc);
            let mut recv = vec![0u8; bc * dt.size()];
            // SAFETY: as above.
            wait(&w, &g, &what, unsafe { g.reduce_scatter(&send, &mut recv, dt, op) });
            let all = reference(dt, op, n, n * bc);
            check(&w, &what, recv[..] == all[me * bc * dt.size()..][..bc * dt.size()]);
            count += 1;
        }
    }
    // Alltoall: block j of rank r is payload (r, j).
    for b in [1usize, 8, 4096] {
        let what = format!("alltoall {b}");
        let send: Vec<u8> = (0..n).flat_map(|j| payload(b, me, j, b)).collect();
        let mut recv = vec![0u8; n * b];
        // SAFETY: as above.
        wait(&w, &g, &what, unsafe { g.alltoall(&send, &mut recv) });
        check(&w, &what, (0..n).all(|r| recv[r * b..][..b] == payload(b, r, me, b)[..]));
        count += 1;
    }
    // What the library does not reduce is refused, nothing posted.
    for (dt, op) in [
        (AtomicType::Float, AtomicOp::Bor),
        (AtomicType::Double, AtomicOp::Bxor),
        (AtomicType::Int32, AtomicOp::Write),
        (AtomicType::Int32, AtomicOp::Lor),
    ] {
        let send = input(dt, AtomicOp::Sum, me, 2);
        let mut recv = vec![0u8; send.len()];
        // SAFETY: as above (nothing is posted).
        match unsafe { g.allreduce(&send, &mut recv, dt, op) } {
            Err(e) if e.kind() == ErrorKind::NoSys => {}
            other => fail(&w, format!("allreduce {dt:?} {op:?}: {other:?}, not NoSys")),
        }
    }
    // Back to back without waiting between: posting the next waits for
    // the last; all are complete once the last is.
    let ops: Vec<_> = (0..20).map(|i| g.barrier().unwrap_or_else(|e| fail(&w, format!("barrier {i}: {e}")))).collect();
    g.wait(*ops.last().unwrap(), TMO).unwrap_or_else(|e| fail(&w, format!("last barrier: {e}")));
    if !ops.iter().all(|&o| g.test(o).unwrap_or(false)) {
        fail(&w, "a barrier before the last is not complete");
    }
    match w.dom.queued_work() {
        Ok(0) => {}
        other => fail(&w, format!("work left queued: {other:?}")),
    }
    let others = g.take_other_completions();
    if !others.is_empty() {
        fail(&w, format!("{} stray completions", others.len()));
    }
    drop(g);
    w.barrier().unwrap_or_else(|e| fail(&w, format!("final barrier: {e}")));
    if me == 0 {
        println!("coll_all: {n} ranks, {count} collectives checked, {:.2} s", t0.elapsed().as_secs_f64());
    }
}
