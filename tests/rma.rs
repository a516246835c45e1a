//! One-sided operations across processes: RMA at every size into the
//! shared heap and into other registered memory (single copy, and through
//! the target's progress engine with single copy off or refused), every
//! atomic op and datatype against a local reference, many ranks on one
//! word, a compare-swap lock, key / range / rights violations that leave
//! the target untouched, exact remote-event counters, and a target that
//! dies during a large RMA.

mod common;
use common::{pattern, put_file, run, run_killing, test_dir, World};
use shmfab::atomic::{load_elem, valid, ALL_OPS, ALL_TYPES};
use shmfab::{AtomicCall, AtomicOp, AtomicType, ErrorKind, MemoryRegion, RmaIoc, RmaIov};
use shmfab::{CqTaggedEntry, FI_ATOMIC, FI_READ, FI_REMOTE_CQ_DATA, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_RMA, FI_WRITE};
use std::io::{IoSlice, IoSliceMut};
use std::time::{Duration, Instant};

const RW: u64 = FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE;
const T: Duration = Duration::from_secs(120);

/// Two tests of `body` on `n` ranks (`killed` of them die by SIGKILL, as
/// `run_killing` says): `$on` with single copy as the host allows it,
/// `$off` with it off (through the target's progress engine).
macro_rules! cma_on_and_off {
    ($on:ident, $off:ident, $n:expr, $killed:expr, $body:expr) => {
        #[test]
        fn $on() {
            run_killing(stringify!($on), $n, &[], T, $killed, $body);
        }

        #[test]
        fn $off() {
            run_killing(stringify!($off), $n, &[("SHMFAB_CMA", "off")], T, $killed, $body);
        }
    };
}

/// Publishes this rank's `vals` under `name`; returns rank `from`'s.
fn share(w: &World, name: &str, vals: &[u64], from: usize) -> Vec<u64> {
    put_file(&format!("{}.{name}", w.rank), &vals.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" "));
    let p = test_dir().join(format!("{from}.{name}"));
    let t0 = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(&p) {
            return s.split_whitespace().map(|v| v.parse().unwrap()).collect();
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "rank {from} never published {name}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether this host lets a process write another with
/// process_vm_writev (containers may not).
fn cma_works() -> bool {
    let mut x = [0u8; 1];
    let l = libc::iovec { iov_base: [1u8].as_ptr() as *mut _, iov_len: 1 };
    let r = libc::iovec { iov_base: x.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: both ranges are ours and valid.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &l, 1, &r, 1, 0) };
    n == 1
}

/// A user buffer registered (page aligned, so atomics are aligned).
struct UserMem {
    buf: Vec<u64>,
    mr: MemoryRegion,
}

fn user_mem(w: &World, len: usize, access: u64) -> UserMem {
    let mut buf = vec![0u64; len.div_ceil(8)];
    // SAFETY: `buf` outlives the registration (dropped after it: the
    // registration is closed first in UserMem's drop order below).
    let mr = unsafe { w.dom.mr_reg(buf.as_mut_ptr().cast(), len, access).unwrap() };
    UserMem { buf, mr }
}

impl UserMem {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the buffer; peers write it only between barriers.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast(), self.mr.len()) }
    }
}

impl Drop for UserMem {
    fn drop(&mut self) {
        self.mr.close().unwrap();
    }
}

fn heap_bytes(mr: &MemoryRegion) -> &[u8] {
    // SAFETY: the heap mapping of the registration, alive with it.
    unsafe { std::slice::from_raw_parts(mr.as_ptr(), mr.len()) }
}

fn sizes() -> Vec<usize> {
    let mut v = vec![1usize, 2, 3, 7, 8, 63, 64, 65, 4095, 4096, 4097, 16383, 16384, 16385, 65536, 65537];
    v.extend([(1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 << 20, 4 << 20]);
    v
}

/// Rank 0 writes every size at an odd offset into rank 1's heap and user
/// memory (checked by rank 1), then reads it back (checked by rank 0).
fn rma_every_size(w: World) {
    const LEN: usize = (4 << 20) + 64;
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(LEN, RW).unwrap();
        let user = user_mem(&w, LEN, RW);
        share(&w, "keys", &[heap.key(), user.mr.key()], 0);
        for (i, &n) in sizes().iter().enumerate() {
            w.barrier();
            let want = pattern(n, i as u64);
            assert_eq!(&heap_bytes(&heap)[5..5 + n], &want[..], "heap, {n} bytes");
            assert_eq!(&user.bytes()[5..5 + n], &want[..], "user memory, {n} bytes");
            w.barrier();
        }
        // The remote CQ data of both writedata calls, in order, read while
        // both registrations are open: remote CQ data names its
        // registration, and once that is closed the entry is dropped as
        // one no initiator of ours sent (this read came after the closing
        // until session 14, and the test hung whenever the inject's entry
        // was served after the close: about 1 run in 20).
        for (data, len) in [(0xfeed, 3), (0xbeef, 2)] {
            let e = w.next().unwrap();
            assert_eq!(e.flags, FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA);
            assert_eq!((e.data, e.len), (data, len));
        }
        w.barrier();
        drop((heap, user));
    } else {
        let k = share(&w, "keys", &[], 1);
        let dest = w.addrs[1];
        for (i, &n) in sizes().iter().enumerate() {
            let data = pattern(n, i as u64);
            for (j, &key) in k.iter().enumerate() {
                w.ep.write(&data, dest, 5, key, 10 + j).unwrap();
                let e = w.wait_ctx(10 + j).unwrap_or_else(|e| panic!("write {n}: {e:?}")).0;
                assert_eq!(e.flags, FI_RMA | FI_WRITE);
            }
            w.barrier();
            for (j, &key) in k.iter().enumerate() {
                let mut back = vec![0u8; n];
                w.ep.read(&mut back, dest, 5, key, 20 + j).unwrap();
                let e = w.wait_ctx(20 + j).unwrap_or_else(|e| panic!("read {n}: {e:?}")).0;
                assert_eq!(e.flags, FI_RMA | FI_READ);
                assert!(back == data, "read back {n} bytes from region {j}");
            }
            w.barrier();
        }
        // Vector and msg forms, inject, and remote CQ data.
        for (j, &key) in k.iter().enumerate() {
            let (a, b) = (pattern(100, 1), pattern(5000, 2));
            w.ep.writev(&[IoSlice::new(&a), IoSlice::new(&b)], dest, 0, key, 30).unwrap();
            w.wait_ctx(30).unwrap();
            let rma = [RmaIov { addr: 9000, len: 3000, key }, RmaIov { addr: 100, len: 2100, key }];
            let mut x = vec![0u8; 2000];
            let mut y = vec![0u8; 3100];
            w.ep.readmsg(
                &mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)],
                &[RmaIov { addr: 0, len: 5100, key }],
                dest,
                31,
                0,
            )
            .unwrap();
            w.wait_ctx(31).unwrap();
            assert_eq!(&x[..100], &a[..]);
            assert_eq!(&x[100..], &b[..1900]);
            assert_eq!(&y[..], &b[1900..]);
            let dc = shmfab::FI_DELIVERY_COMPLETE | shmfab::FI_COMPLETION;
            w.ep.writemsg(&[IoSlice::new(&a), IoSlice::new(&b)], &rma, dest, 32, 0, dc).unwrap();
            w.wait_ctx(32).unwrap();
            let ab = [a.clone(), b.clone()].concat();
            let mut z = vec![0u8; 3000];
            let mut z2 = vec![0u8; 2100];
            w.ep.readv(&mut [IoSliceMut::new(&mut z)], dest, 9000, key, 33).unwrap();
            w.wait_ctx(33).unwrap();
            w.ep.read(&mut z2, dest, 100, key, 33).unwrap();
            w.wait_ctx(33).unwrap();
            assert_eq!(&z[..], &ab[..3000]);
            assert_eq!(&z2[..], &ab[3000..]);
            w.ep.inject_write(&a[..64], dest, 64, key).unwrap();
            let mut q = vec![0u8; 64];
            w.ep.read(&mut q, dest, 64, key, 34).unwrap();
            w.wait_ctx(34).unwrap();
            assert_eq!(q, a[..64]);
            let _ = j;
        }
        let st = w.dom.rma_stats();
        assert!(st.heap > 0, "{st:?}");
        let cma = w.dom.config().cma;
        if cma != shmfab::proto::CmaMode::Auto || !cma_works() {
            assert_eq!(st.cma, 0, "{st:?}");
            assert!(st.mailbox > 0, "{st:?}");
        } else {
            assert!(st.cma > 0 && st.mailbox == 0, "{st:?}");
        }
        w.ep.writedata(&[1, 2, 3], 0xfeed, dest, 0, k[0], 40).unwrap();
        w.wait_ctx(40).unwrap();
        w.ep.inject_writedata(&[4, 5], 0xbeef, dest, 0, k[1]).unwrap();
        w.barrier();
    }
    w.barrier();
}

cma_on_and_off!(rma_every_size_single_copy, rma_every_size_cma_off, 2, &[], rma_every_size);

#[test]
fn rma_every_size_cma_refused() {
    run("rma_every_size_cma_refused", 2, &[("SHMFAB_CMA", "fail")], T, rma_every_size);
}

/// Named regions (ranks in other PID namespaces): each domain's RMA file
/// is named after its region, peers open it by name, and it goes with its
/// owner (the harness checks nothing of the job is left).
#[test]
fn rma_every_size_named_regions() {
    run("rma_every_size_named_regions", 2, &[("SHMFAB_REGIONS", "named")], T, rma_every_size);
}

#[test]
fn atomics_all_named_regions() {
    run("atomics_all_named_regions", 2, &[("SHMFAB_REGIONS", "named")], T, atomics_all);
}

/// Wrong keys, stale keys, ranges past the end and missing rights fail
/// with an error completion at the initiator; the target's memory stays
/// as it was.
fn violations(w: World) {
    const LEN: usize = 8192;
    if w.rank == 1 {
        let ro_heap = w.dom.alloc_shared(LEN, FI_REMOTE_READ).unwrap();
        let wo_heap = w.dom.alloc_shared(LEN, FI_REMOTE_WRITE).unwrap();
        let ro_user = user_mem(&w, LEN, FI_REMOTE_READ);
        let wo_user = user_mem(&w, LEN, FI_REMOTE_WRITE);
        let mut stale = w.dom.alloc_shared(LEN, RW).unwrap();
        let stale_key = stale.key();
        stale.close().unwrap();
        // A new registration takes the freed slot: the stale key must not
        // reach it.
        let fresh = w.dom.alloc_shared(LEN, RW).unwrap();
        share(
            &w,
            "keys",
            &[ro_heap.key(), wo_heap.key(), ro_user.mr.key(), wo_user.mr.key(), stale_key, fresh.key()],
            0,
        );
        w.barrier();
        for b in [heap_bytes(&ro_heap), heap_bytes(&wo_heap), ro_user.bytes(), wo_user.bytes(), heap_bytes(&fresh)] {
            assert!(b.iter().all(|&x| x == 0), "the target's memory was touched");
        }
        w.barrier();
    } else {
        let k = share(&w, "keys", &[], 1);
        let dest = w.addrs[1];
        let data = pattern(LEN, 7);
        let expect_err = |what: &str, ctx: usize, kind: ErrorKind| {
            let e = w.wait_ctx(ctx).expect_err(what);
            assert_eq!(e.err, kind.errno(), "{what}: {e:?}");
        };
        let (ro_h, wo_h, ro_u, wo_u, stale, fresh) = (k[0], k[1], k[2], k[3], k[4], k[5]);
        let mut back = vec![0u8; 16];
        for (i, key) in [ro_h, ro_u].into_iter().enumerate() {
            w.ep.write(&data[..16], dest, 0, key, 100 + i).unwrap();
            expect_err("write to read-only", 100 + i, ErrorKind::Perm);
            w.ep.atomic(AtomicType::Uint64, AtomicOp::Sum, &[1; 8], dest, 0, key, 110 + i).unwrap();
            expect_err("atomic on read-only", 110 + i, ErrorKind::Perm);
        }
        for (i, key) in [wo_h, wo_u].into_iter().enumerate() {
            w.ep.read(&mut back, dest, 0, key, 120 + i).unwrap();
            expect_err("read from write-only", 120 + i, ErrorKind::Perm);
            let mut r = [0u8; 8];
            w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &[1; 8], &mut r, dest, 0, key, 130 + i).unwrap();
            expect_err("fetch on write-only", 130 + i, ErrorKind::Perm);
            // Past the end, and straddling it.
            w.ep.write(&data[..16], dest, LEN as u64, key, 140 + i).unwrap();
            expect_err("write past the end", 140 + i, ErrorKind::Inval);
            w.ep.write(&data[..16], dest, LEN as u64 - 8, key, 150 + i).unwrap();
            expect_err("write straddling the end", 150 + i, ErrorKind::Inval);
            w.ep.write(&data[..16], dest, u64::MAX - 4, key, 160 + i).unwrap();
            expect_err("write at an overflowing offset", 160 + i, ErrorKind::Inval);
            // A wrong tag.
            w.ep.write(&data[..16], dest, 0, key ^ 0x5a5a, 170 + i).unwrap();
            expect_err("wrong key", 170 + i, ErrorKind::NoKey);
            w.ep.write(&data[..16], dest, 0, key ^ (1 << 32), 180 + i).unwrap();
            expect_err("key of another slot", 180 + i, ErrorKind::NoKey);
            for bit in [48, 49, 55] {
                w.ep.write(&data[..16], dest, 0, key ^ (1 << bit), 185 + i).unwrap();
                expect_err("key naming another descriptor", 185 + i, ErrorKind::NoKey);
            }
        }
        w.ep.write(&data[..16], dest, 0, stale, 190).unwrap();
        expect_err("stale key", 190, ErrorKind::NoKey);
        assert_ne!(stale, fresh);
        // Inject calls write no entry on success, but their errors are
        // reported (fi_endpoint(3)), with no context.
        w.ep.inject_write(&data[..16], dest, 0, stale).unwrap();
        expect_err("inject_write with a stale key", 0, ErrorKind::NoKey);
        w.ep.inject_atomic(AtomicType::Uint64, AtomicOp::Sum, &[1; 8], dest, 0, ro_h).unwrap();
        expect_err("inject_atomic on read-only", 0, ErrorKind::Perm);
        w.ep.inject_writedata(&data[..8], 5, dest, LEN as u64, wo_u).unwrap();
        expect_err("inject_writedata past the end", 0, ErrorKind::Inval);
        w.barrier();
        w.barrier();
    }
}

cma_on_and_off!(rma_violations_single_copy, rma_violations_cma_off, 2, &[], violations);

/// The reference: fi_atomic(3)'s definitions, written apart from the
/// library's (integers widened to i128, then cut to their width).
fn reference(dt: AtomicType, op: AtomicOp, old: u128, a: u128, c: u128) -> u128 {
    use AtomicOp::*;
    use AtomicType::*;
    let bits = 8 * dt.size() as u32;
    let mask = if bits == 128 { u128::MAX } else { (1u128 << bits) - 1 };
    let signed = matches!(dt, Int8 | Int16 | Int32 | Int64);
    let wide = |v: u128| -> i128 {
        if signed && v >> (bits - 1) & 1 == 1 {
            (v | !mask) as i128
        } else {
            v as i128
        }
    };
    let cut = |v: i128| (v as u128) & mask;
    let when = |cond: bool, x: u128| if cond { x } else { old };
    match dt {
        Float | Double => {
            let f = |v: u128| if bits == 32 { f32::from_bits(v as u32) as f64 } else { f64::from_bits(v as u64) };
            let back = |v: f64| if bits == 32 { (v as f32).to_bits() as u128 } else { v.to_bits() as u128 };
            let (o, x, k) = (f(old), f(a), f(c));
            let t = |b: bool| back(if b { 1.0 } else { 0.0 });
            match op {
                Min => when(x < o, a),
                Max => when(x > o, a),
                Sum => back(o + x),
                Prod => back(o * x),
                Lor => t(o != 0.0 || x != 0.0),
                Land => t(o != 0.0 && x != 0.0),
                Lxor => t((o != 0.0) ^ (x != 0.0)),
                Read => old,
                Write => a,
                Cswap => when(k == o, a),
                CswapNe => when(k != o, a),
                CswapLe => when(k <= o, a),
                CswapLt => when(k < o, a),
                CswapGe => when(k >= o, a),
                CswapGt => when(k > o, a),
                _ => unreachable!(),
            }
        }
        FloatComplex | DoubleComplex => {
            let h = bits / 2;
            let part = |v: u128, i: u32| {
                let w = (v >> (i * h)) & ((1u128 << h) - 1);
                if h == 32 {
                    f32::from_bits(w as u32) as f64
                } else {
                    f64::from_bits(w as u64)
                }
            };
            let enc = |v: f64| if h == 32 { (v as f32).to_bits() as u128 } else { v.to_bits() as u128 };
            let pack = |re: f64, im: f64| enc(re) | enc(im) << h;
            let (or, oi, xr, xi) = (part(old, 0), part(old, 1), part(a, 0), part(a, 1));
            match op {
                Sum => pack(or + xr, oi + xi),
                Prod => pack(or * xr - oi * xi, or * xi + oi * xr),
                Read => old,
                Write => a,
                Cswap => when(c == old, a),
                CswapNe => when(c != old, a),
                _ => unreachable!(),
            }
        }
        _ => {
            let (o, x, k) = (wide(old), wide(a), wide(c));
            match op {
                Min => cut(o.min(x)),
                Max => cut(o.max(x)),
                Sum => cut(o.wrapping_add(x)),
                Prod => cut(o.wrapping_mul(x)),
                Lor => (o != 0 || x != 0) as u128,
                Land => (o != 0 && x != 0) as u128,
                Lxor => ((o != 0) != (x != 0)) as u128,
                Bor => old | a,
                Band => old & a,
                Bxor => old ^ a,
                Read => old,
                Write => a,
                Cswap => when(k == o, a),
                CswapNe => when(k != o, a),
                CswapLe => when(k <= o, a),
                CswapLt => when(k < o, a),
                CswapGe => when(k >= o, a),
                CswapGt => when(k > o, a),
                Mswap => (a & c) | (old & !c & mask),
            }
        }
    }
}

fn elem_bytes(dt: AtomicType, v: u128) -> Vec<u8> {
    v.to_le_bytes()[..dt.size()].to_vec()
}

/// A value of `dt` from a seed: small integers (so that sums and
/// products stay exact in floats), as bit patterns.
fn sample(dt: AtomicType, s: i64) -> u128 {
    use AtomicType::*;
    match dt {
        Float => (s as f32).to_bits() as u128,
        Double => (s as f64).to_bits() as u128,
        FloatComplex => (s as f32).to_bits() as u128 | ((s as f32 - 1.5).to_bits() as u128) << 32,
        DoubleComplex => (s as f64).to_bits() as u128 | ((s as f64 + 0.5).to_bits() as u128) << 64,
        _ => (s as i128 as u128) & ((1u128 << (8 * dt.size())) - 1),
    }
}

/// Every valid (call, op, datatype) on rank 1's heap and user memory,
/// from rank 0: the old value comes back and the new one is in place, as
/// the local reference computes them; invalid ones are refused.
fn atomics_all(w: World) {
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        let user = user_mem(&w, 4096, RW);
        share(&w, "keys", &[heap.key(), user.mr.key()], 0);
        w.barrier();
    } else {
        let k = share(&w, "keys", &[], 1);
        let dest = w.addrs[1];
        let mut n = 0usize;
        for &key in &k {
            for dt in ALL_TYPES {
                for op in ALL_OPS {
                    for call in [AtomicCall::Write, AtomicCall::Fetch, AtomicCall::Compare] {
                        let q = match call {
                            AtomicCall::Write => w.ep.atomic_valid(dt, op),
                            AtomicCall::Fetch => w.ep.fetch_atomic_valid(dt, op),
                            AtomicCall::Compare => w.ep.compare_atomic_valid(dt, op),
                        };
                        let d = w.dom.query_atomic(dt, op, call);
                        if !valid(call, dt, op) {
                            assert_eq!(q.unwrap_err().kind(), ErrorKind::OpNotSupp, "{call:?} {op:?} {dt:?}");
                            assert_eq!(d.unwrap_err().kind(), ErrorKind::OpNotSupp, "{call:?} {op:?} {dt:?}");
                            // And the call itself refuses it.
                            let (one, mut res) = (vec![0u8; dt.size()], vec![0u8; dt.size()]);
                            let r = match call {
                                AtomicCall::Write => w.ep.atomic(dt, op, &one, dest, 0, key, 9),
                                AtomicCall::Fetch => w.ep.fetch_atomic(dt, op, &one, &mut res, dest, 0, key, 9),
                                AtomicCall::Compare => {
                                    w.ep.compare_atomic(dt, op, &one, &one, &mut res, dest, 0, key, 9)
                                }
                            };
                            assert_eq!(r.unwrap_err().kind(), ErrorKind::OpNotSupp, "{call:?} {op:?} {dt:?}");
                            continue;
                        }
                        let q = q.unwrap();
                        assert!(q >= 1);
                        assert_eq!(d.unwrap(), shmfab::AtomicAttr { size: dt.size(), count: q });
                        for (init, opnd, cmp) in
                            [(5i64, 3i64, 5i64), (-2, 7, 1), (4, 4, 9), (0, -6, 0), (-128, -1, -128), (100, 3, 101)]
                        {
                            let sz = dt.size();
                            let off = 32 * (n % 100) as u64;
                            n += 1;
                            let (i0, a, c) = (sample(dt, init), sample(dt, opnd), sample(dt, cmp));
                            // Two elements: the second with operands swapped.
                            let mut ibuf = elem_bytes(dt, i0);
                            ibuf.extend(elem_bytes(dt, a));
                            w.ep.write(&ibuf, dest, off, key, 1).unwrap();
                            w.wait_ctx(1).unwrap();
                            let mut obuf = elem_bytes(dt, a);
                            obuf.extend(elem_bytes(dt, i0));
                            let mut cbuf = elem_bytes(dt, c);
                            cbuf.extend(elem_bytes(dt, c));
                            let mut res = vec![0u8; 2 * sz];
                            match call {
                                AtomicCall::Write => w.ep.atomic(dt, op, &obuf, dest, off, key, 2).unwrap(),
                                AtomicCall::Fetch => {
                                    w.ep.fetch_atomic(dt, op, &obuf, &mut res, dest, off, key, 2).unwrap()
                                }
                                AtomicCall::Compare => {
                                    w.ep.compare_atomic(dt, op, &obuf, &cbuf, &mut res, dest, off, key, 2).unwrap()
                                }
                            }
                            let e = w.wait_ctx(2).unwrap_or_else(|e| panic!("{call:?} {op:?} {dt:?}: {e:?}")).0;
                            let want_flags = if call == AtomicCall::Write { FI_WRITE } else { FI_READ };
                            assert_eq!(e.flags, shmfab::FI_ATOMIC | want_flags);
                            let mut now = vec![0u8; 2 * sz];
                            w.ep.read(&mut now, dest, off, key, 3).unwrap();
                            w.wait_ctx(3).unwrap();
                            let olds = [i0, a];
                            let ops = [a, i0];
                            for j in 0..2 {
                                let want = reference(dt, op, olds[j], ops[j], c);
                                let got = load_elem(&now[j * sz..(j + 1) * sz]);
                                assert_eq!(got, want, "{call:?} {op:?} {dt:?} elem {j}: {init} {opnd} {cmp}");
                                if call != AtomicCall::Write {
                                    assert_eq!(load_elem(&res[j * sz..(j + 1) * sz]), olds[j], "fetched old value");
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(n > 400);
        w.barrier();
    }
}

cma_on_and_off!(atomics_every_op_and_type, atomics_every_op_and_type_cma_off, 2, &[], atomics_all);

/// `n` ranks each fetch-add 1 `per` times on one word of rank 0 (heap or
/// user memory): the final value is exact and the fetched values are all
/// distinct.
fn fetch_adds(w: World, per: usize, heap: bool) {
    let mem = (w.rank == 0).then(|| {
        if heap {
            (Some(w.dom.alloc_shared(64, RW).unwrap()), None)
        } else {
            (None, Some(user_mem(&w, 64, RW)))
        }
    });
    let key = match &mem {
        Some((Some(h), _)) => h.key(),
        Some((_, Some(u))) => u.mr.key(),
        _ => 0,
    };
    let key = share(&w, "key", &[key], 0)[0];
    w.barrier();
    let mut got = Vec::with_capacity(per);
    let one = 1u64.to_le_bytes();
    let mut r = [0u8; 8];
    for i in 0..per {
        w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut r, w.addrs[0], 0, key, 7).unwrap();
        if i % 256 == 255 || i == per - 1 {
            // Completions are written at once; read them now and then.
            while w.cq.read(&mut [shmfab::CqTaggedEntry::default(); 64]).is_ok() {}
        }
        got.push(u64::from_le_bytes(r));
    }
    put_file(&format!("{}.fetched", w.rank), &got.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" "));
    w.barrier();
    if w.rank == 0 {
        let total = (w.size * per) as u64;
        let mut all: Vec<u64> = (0..w.size)
            .flat_map(|r| {
                let s = std::fs::read_to_string(test_dir().join(format!("{r}.fetched"))).unwrap();
                s.split_whitespace().map(|v| v.parse::<u64>().unwrap()).collect::<Vec<_>>()
            })
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..total).collect::<Vec<_>>(), "fetched values are 0..{total}, each once");
        let fin = match &mem {
            Some((Some(h), _)) => u64::from_le_bytes(heap_bytes(h)[..8].try_into().unwrap()),
            Some((_, Some(u))) => u.buf[0],
            _ => unreachable!(),
        };
        assert_eq!(fin, total);
    }
    w.barrier();
}

#[test]
fn fetch_add_8_ranks_100k_heap() {
    run("fetch_add_8_ranks_100k_heap", 8, &[], Duration::from_secs(300), |w| fetch_adds(w, 100_000, true));
}

#[test]
fn fetch_add_4_ranks_user_memory() {
    run("fetch_add_4_ranks_user_memory", 4, &[], Duration::from_secs(300), |w| fetch_adds(w, 5_000, false));
}

/// A lock taken with CSWAP (0 -> rank + 1) and released with
/// ATOMIC_WRITE guards a counter read and written with plain RMA.
#[test]
fn cswap_lock_guards_a_counter() {
    run("cswap_lock_guards_a_counter", 4, &[], Duration::from_secs(300), |w| {
        let mem = (w.rank == 0).then(|| w.dom.alloc_shared(128, RW).unwrap());
        let key = share(&w, "key", &[mem.as_ref().map_or(0, |m| m.key())], 0)[0];
        w.barrier();
        let dest = w.addrs[0];
        let me = (w.rank as u64 + 1).to_le_bytes();
        let per = 1000;
        for _ in 0..per {
            let mut old = [0u8; 8];
            loop {
                w.ep.compare_atomic(AtomicType::Uint64, AtomicOp::Cswap, &me, &[0; 8], &mut old, dest, 0, key, 1)
                    .unwrap();
                w.wait_ctx(1).unwrap();
                if old == [0; 8] {
                    break;
                }
            }
            let mut c = [0u8; 8];
            w.ep.read(&mut c, dest, 64, key, 2).unwrap();
            w.wait_ctx(2).unwrap();
            let next = (u64::from_le_bytes(c) + 1).to_le_bytes();
            w.ep.write(&next, dest, 64, key, 3).unwrap();
            w.wait_ctx(3).unwrap();
            w.ep.atomic(AtomicType::Uint64, AtomicOp::Write, &[0; 8], dest, 0, key, 4).unwrap();
            w.wait_ctx(4).unwrap();
        }
        w.barrier();
        if let Some(m) = &mem {
            let c = u64::from_le_bytes(heap_bytes(m)[64..72].try_into().unwrap());
            assert_eq!(c, (per * w.size) as u64);
        }
        w.barrier();
    });
}

/// Counters bound to a registration with FI_REMOTE_WRITE / FI_REMOTE_READ
/// count exactly the operations that landed (not the refused ones).
fn remote_counters(w: World) {
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(1 << 20, RW).unwrap();
        let user = user_mem(&w, 1 << 20, RW);
        let (cw, cr) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        for mr in [&heap, &user.mr] {
            mr.bind_counter(&cw, FI_REMOTE_WRITE).unwrap();
            mr.bind_counter(&cr, FI_REMOTE_READ).unwrap();
        }
        share(&w, "keys", &[heap.key(), user.mr.key()], 0);
        w.barrier();
        // Per region: 10 writes (one of 1 MiB), 3 atomics, 2 fetch-adds
        // (count as both), 5 reads; the refused ones count nowhere.
        let t0 = Instant::now();
        let now = || (cw.read().unwrap(), cr.read().unwrap());
        while now() != (2 * 15, 2 * 7) {
            w.dom.progress().unwrap();
            assert!(t0.elapsed() < Duration::from_secs(20), "counters {:?}", now());
        }
        w.barrier();
        assert_eq!(now(), (30, 14));
    } else {
        let k = share(&w, "keys", &[], 1);
        let dest = w.addrs[1];
        for &key in &k {
            for i in 0..10 {
                let n = if i == 0 { 1 << 20 } else { 100 };
                w.ep.write(&pattern(n, i), dest, 0, key, 1).unwrap();
                w.wait_ctx(1).unwrap();
            }
            w.ep.write(&[0; 8], dest, 1 << 20, key, 1).unwrap();
            w.wait_ctx(1).unwrap_err();
            for _ in 0..3 {
                w.ep.atomic(AtomicType::Uint32, AtomicOp::Bor, &[1; 4], dest, 8, key, 2).unwrap();
                w.wait_ctx(2).unwrap();
            }
            let mut r = [0u8; 8];
            for _ in 0..2 {
                w.ep.fetch_atomic(AtomicType::Int64, AtomicOp::Sum, &[1; 8], &mut r, dest, 16, key, 2).unwrap();
                w.wait_ctx(2).unwrap();
            }
            for _ in 0..5 {
                let mut b = vec![0u8; 4096];
                w.ep.read(&mut b, dest, 4096, key, 3).unwrap();
                w.wait_ctx(3).unwrap();
            }
        }
        w.barrier();
        w.barrier();
    }
    w.barrier();
}

cma_on_and_off!(remote_counters_exact, remote_counters_exact_cma_off, 2, &[], remote_counters);

/// Binding counters to a registration while a peer writes it: no access
/// fails (a bind used to close the registration for an instant, so a
/// racing access got FI_ENOKEY), and once the last bind is done every
/// write lands on the last bound counter.
fn bind_during_traffic(w: World) {
    const N: u64 = 20_000;
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        let (a, b) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        share(&w, "key", &[heap.key()], 0);
        w.barrier();
        for i in 0..400 {
            heap.bind_counter(if i % 2 == 0 { &a } else { &b }, FI_REMOTE_WRITE).unwrap();
            std::thread::yield_now();
        }
        heap.bind_counter(&a, FI_REMOTE_WRITE).unwrap();
        w.barrier(); // the last bind is done, and rank 0's first N writes
        let before = a.read().unwrap() + b.read().unwrap();
        w.barrier(); // counted before rank 0 writes again
        w.barrier(); // rank 0 wrote N more
        assert!(before <= N, "{before} counted of {N}");
        assert_eq!(a.read().unwrap() + b.read().unwrap(), before + N);
    } else {
        let key = share(&w, "key", &[], 1)[0];
        w.barrier();
        for i in 0..N {
            w.ep.write(&i.to_le_bytes(), w.addrs[1], 0, key, 1).unwrap();
            w.wait_ctx(1).unwrap_or_else(|e| panic!("write {i} failed while the target bound a counter: {e:?}"));
        }
        w.barrier();
        w.barrier();
        for i in 0..N {
            w.ep.write(&i.to_le_bytes(), w.addrs[1], 0, key, 1).unwrap();
            w.wait_ctx(1).unwrap();
        }
        w.barrier();
    }
}

#[test]
fn binding_a_counter_while_a_peer_writes() {
    run("binding_a_counter_while_a_peer_writes", 2, &[], T, bind_during_traffic);
}

/// Rank 1 registers 128 MiB and dies by SIGKILL while rank 0 writes it
/// over and over: rank 0 gets an error completion within seconds.
fn target_dies(w: World) {
    const LEN: usize = 128 << 20;
    if w.rank == 1 {
        let user = user_mem(&w, LEN, RW);
        share(&w, "key", &[user.mr.key()], 0);
        w.barrier();
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: plain syscall; this rank is expected to die so.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!();
    }
    let key = share(&w, "key", &[], 1)[0];
    w.barrier();
    let data = vec![0x5au8; LEN];
    let t0 = Instant::now();
    let mut i = 0usize;
    loop {
        w.ep.write(&data, w.addrs[1], 0, key, 50 + i).unwrap();
        match w.wait_ctx(50 + i) {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.err, ErrorKind::Io.errno(), "{e:?}");
                break;
            }
        }
        i += 1;
        assert!(t0.elapsed() < Duration::from_secs(20), "no error 20 s after the target died");
    }
}

cma_on_and_off!(target_dies_during_large_rma, target_dies_during_large_rma_cma_off, 2, &[1], target_dies);

/// The same with named regions: the dead target's named RMA file is left,
/// judged dead (its lock is free) and removed by `clean_dead`.
#[test]
fn target_dies_during_large_rma_named_regions() {
    run_killing("target_dies_during_large_rma_named_regions", 2, &[("SHMFAB_REGIONS", "named")], T, &[1], target_dies);
}

/// A registration closed while a peer writes it in a loop: once `close`
/// returns, the memory is never written again (the peer's writes fail
/// with -FI_ENOKEY), and a new registration in the freed heap space is
/// out of reach of the old key.
fn close_while_in_use(w: World) {
    const LEN: usize = 1 << 20;
    if w.rank == 1 {
        let mut heap = w.dom.alloc_shared(LEN, RW).unwrap();
        let mut user = user_mem(&w, LEN, RW);
        share(&w, "keys", &[heap.key(), user.mr.key()], 0);
        w.barrier();
        let t0 = Instant::now();
        while heap_bytes(&heap)[0] == 0 || user.bytes()[0] == 0 {
            assert!(t0.elapsed() < Duration::from_secs(20), "the writes never came");
            w.dom.progress().unwrap();
        }
        heap.close().unwrap();
        user.mr.close().unwrap();
        user.buf.iter_mut().for_each(|x| *x = 0);
        let fresh = w.dom.alloc_shared(LEN, RW).unwrap();
        let t1 = Instant::now();
        while t1.elapsed() < Duration::from_millis(300) {
            w.dom.progress().unwrap();
        }
        // SAFETY: the buffer is no longer registered.
        let ub = unsafe { std::slice::from_raw_parts(user.buf.as_ptr() as *const u8, LEN) };
        assert!(ub.iter().all(|&b| b == 0), "user memory written after close returned");
        assert!(heap_bytes(&fresh).iter().all(|&b| b == 0), "new heap registration written with an old key");
        put_file("1.closed", "");
        w.barrier();
    } else {
        let k = share(&w, "keys", &[], 1);
        w.barrier();
        let data = vec![0xa5u8; LEN];
        let mut failed = [false; 2];
        let t0 = Instant::now();
        while !test_dir().join("1.closed").exists() {
            for (j, &key) in k.iter().enumerate() {
                w.ep.write(&data, w.addrs[1], 0, key, 60 + j).unwrap();
                if let Err(e) = w.wait_ctx(60 + j) {
                    assert_eq!(e.err, ErrorKind::NoKey.errno(), "{e:?}");
                    failed[j] = true;
                } else {
                    assert!(!failed[j], "a write succeeded after one failed for a closed key");
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(30));
        }
        assert_eq!(failed, [true, true]);
        w.barrier();
    }
}

cma_on_and_off!(close_while_in_use_single_copy, close_while_in_use_cma_off, 2, &[], close_while_in_use);

/// One rank targets its own memory (loopback), by every path.
fn loopback(w: World) {
    let heap = w.dom.alloc_shared(4096, RW).unwrap();
    let user = user_mem(&w, 4096, RW);
    let me = w.addrs[0];
    for key in [heap.key(), user.mr.key()] {
        let d = pattern(3000, key);
        w.ep.write(&d, me, 7, key, 1).unwrap();
        w.wait_ctx(1).unwrap();
        let mut b = vec![0u8; 3000];
        w.ep.read(&mut b, me, 7, key, 2).unwrap();
        w.wait_ctx(2).unwrap();
        assert_eq!(b, d);
        let mut r = [0u8; 8];
        for i in 0..10u64 {
            w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &2u64.to_le_bytes(), &mut r, me, 4088, key, 3)
                .unwrap();
            w.wait_ctx(3).unwrap();
            assert_eq!(u64::from_le_bytes(r), 2 * i);
        }
    }
    assert_eq!(&heap_bytes(&heap)[7..3007], &pattern(3000, heap.key())[..]);
    assert_eq!(&user.bytes()[7..3007], &pattern(3000, user.mr.key())[..]);
}

cma_on_and_off!(loopback_rma, loopback_rma_cma_off, 1, &[], loopback);

/// Rank 0 fills every mailbox slot of rank 1 (16 domains of its own, each
/// waiting on a write that rank 1, asleep, does not serve yet) and dies:
/// the slots its dead initiators held are reclaimed, and rank 2's writes
/// through the mailbox still go through.
#[test]
fn mailbox_slots_of_dead_initiators_are_reclaimed() {
    let env = [("SHMFAB_CMA", "off")];
    run_killing("mailbox_slots_of_dead_initiators_are_reclaimed", 3, &env, T, &[0], |w| {
        if w.rank == 1 {
            let user = user_mem(&w, 4096, RW);
            share(&w, "key", &[user.mr.key()], 0);
            // Asleep (no progress) until rank 0 filled the mailbox and died.
            let p = test_dir().join("0.filled");
            let t0 = Instant::now();
            while !p.exists() {
                assert!(t0.elapsed() < Duration::from_secs(30));
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(300));
            put_file("1.serving", "");
            let t1 = Instant::now();
            while !test_dir().join("2.done").exists() {
                assert!(t1.elapsed() < Duration::from_secs(30), "rank 2 never got through");
                w.dom.progress().unwrap();
            }
            assert_eq!(&user.bytes()[..4], &[9, 9, 9, 9]);
        } else if w.rank == 0 {
            let key = share(&w, "key", &[], 1)[0];
            let b = std::fs::read(test_dir().join("1.addr")).unwrap();
            let target = shmfab::Address::from_bytes(&b).unwrap();
            for i in 0..17 {
                std::thread::spawn(move || {
                    let fabric = shmfab::Fabric::open().unwrap();
                    let dom = fabric.domain().unwrap();
                    let (_cq, av, ep) = common::open_endpoint(&dom);
                    let a = av.insert(&[target]).unwrap()[0];
                    let _ = ep.write(&[i as u8; 64], a, 0, key, 1);
                    std::thread::sleep(Duration::from_secs(60));
                });
            }
            std::thread::sleep(Duration::from_millis(500));
            put_file("0.filled", "");
            // SAFETY: plain syscall; this rank is expected to die so.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        } else {
            let key = share(&w, "key", &[], 1)[0];
            let t0 = Instant::now();
            while !test_dir().join("1.serving").exists() {
                assert!(t0.elapsed() < Duration::from_secs(30));
                std::thread::sleep(Duration::from_millis(5));
            }
            for _ in 0..20 {
                w.ep.write(&[9; 4], w.addrs[1], 0, key, 5).unwrap();
                w.wait_ctx(5).unwrap();
            }
            put_file("2.done", "");
        }
    });
}

/// The atomic msg forms: several remote segments in one call, the old
/// values of all of them, and remote CQ data.
fn atomic_msgs(w: World) {
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        let user = user_mem(&w, 4096, RW);
        share(&w, "keys", &[heap.key(), user.mr.key()], 0);
        w.barrier();
        for _ in 0..2 {
            let e = w.next().unwrap();
            assert_eq!((e.flags & FI_REMOTE_CQ_DATA, e.data), (FI_REMOTE_CQ_DATA, 77));
        }
        for b in [heap_bytes(&heap), user.bytes()] {
            let word = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
            assert_eq!((word(0), word(4), word(64)), (0xff, 12, 40));
        }
    } else {
        let k = share(&w, "keys", &[], 1);
        let dest = w.addrs[1];
        let le = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for &key in &k {
            let iocs = [RmaIoc { addr: 0, count: 2, key }, RmaIoc { addr: 64, count: 1, key }];
            w.ep.atomicmsg(AtomicType::Uint32, AtomicOp::Sum, &le(&[10, 11, 12]), &iocs, dest, 1, 0, 0).unwrap();
            w.wait_ctx(1).unwrap();
            let mut r = vec![0u8; 12];
            w.ep.fetch_atomicmsg(AtomicType::Uint32, AtomicOp::Sum, &le(&[1, 1, 28]), &mut r, &iocs, dest, 2, 0, 0)
                .unwrap();
            w.wait_ctx(2).unwrap();
            assert_eq!(r, le(&[10, 11, 12]));
            let iocs1 = [RmaIoc { addr: 0, count: 1, key }];
            w.ep.compare_atomicmsg(
                AtomicType::Uint32,
                AtomicOp::Cswap,
                &le(&[0xff]),
                &le(&[11]),
                &mut r[..4],
                &iocs1,
                dest,
                3,
                77,
                FI_REMOTE_CQ_DATA,
            )
            .unwrap();
            w.wait_ctx(3).unwrap();
            assert_eq!(&r[..4], &le(&[11])[..]);
        }
        w.barrier();
    }
    w.barrier();
}

#[test]
fn atomic_msg_forms() {
    run("atomic_msg_forms", 2, &[], T, atomic_msgs);
}

/// Counters bound to the target endpoint with FI_REMOTE_WRITE and
/// FI_REMOTE_READ count what landed through its address, in any
/// registration; a counter bound both to the endpoint and to the
/// registration counts each operation once.
fn endpoint_counters(w: World) {
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(8192, RW).unwrap();
        let user = user_mem(&w, 8192, RW);
        let (cw, cr) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        heap.bind_counter(&cw, FI_REMOTE_WRITE).unwrap();
        let (cq, av, ep) =
            (w.dom.cq_open(&shmfab::CqAttr::default()).unwrap(), w.dom.av_open().unwrap(), w.dom.endpoint().unwrap());
        ep.bind_cq(&cq, shmfab::FI_TRANSMIT | shmfab::FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cntr(&cw, FI_REMOTE_WRITE).unwrap();
        ep.bind_cntr(&cr, FI_REMOTE_READ).unwrap();
        ep.enable().unwrap();
        put_file("1.ep2", &ep.getname().to_bytes().iter().map(|b| b.to_string()).collect::<Vec<_>>().join(" "));
        share(&w, "keys", &[heap.key(), user.mr.key()], 0);
        w.barrier();
        let t0 = Instant::now();
        let now = || (cw.read().unwrap(), cr.read().unwrap());
        while now() != (12, 6) {
            w.dom.progress().unwrap();
            assert!(t0.elapsed() < Duration::from_secs(20), "counters {:?}", now());
        }
        w.barrier();
        assert_eq!(now(), (12, 6));
        ep.close().unwrap();
    } else {
        let k = share(&w, "keys", &[], 1);
        let s = std::fs::read_to_string(test_dir().join("1.ep2")).unwrap();
        let b: Vec<u8> = s.split_whitespace().map(|v| v.parse().unwrap()).collect();
        let dest = w.av.insert(&[shmfab::Address::from_bytes(&b).unwrap()]).unwrap()[0];
        for &key in &k {
            for _ in 0..4 {
                w.ep.write(&[1; 64], dest, 0, key, 1).unwrap();
                w.wait_ctx(1).unwrap();
            }
            for _ in 0..2 {
                let mut b = [0u8; 64];
                w.ep.read(&mut b, dest, 0, key, 2).unwrap();
                w.wait_ctx(2).unwrap();
            }
            w.ep.atomic(AtomicType::Uint64, AtomicOp::Sum, &[1; 8], dest, 64, key, 3).unwrap();
            w.wait_ctx(3).unwrap();
            let mut r = [0u8; 8];
            w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &[1; 8], &mut r, dest, 64, key, 3).unwrap();
            w.wait_ctx(3).unwrap();
        }
        w.barrier();
        w.barrier();
    }
}

cma_on_and_off!(endpoint_remote_counters, endpoint_remote_counters_cma_off, 2, &[], endpoint_counters);

/// Every rank does atomics on the next rank's user memory at the same
/// time, single copy off: every call waits for its target's progress
/// engine, and each target is itself inside such a call. A rank waiting
/// serves the requests on its own memory, or the ring of ranks would wait
/// on each other for ever.
fn crossed_mailboxes(w: World) {
    const PER: usize = 2000;
    let mem = user_mem(&w, 64, RW);
    let next = (w.rank + 1) % w.size;
    let key = share(&w, "key", &[mem.mr.key()], next)[0];
    w.barrier();
    let one = 1u64.to_le_bytes();
    let mut r = [0u8; 8];
    for i in 0..PER {
        w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut r, w.addrs[next], 0, key, 7).unwrap();
        assert_eq!(u64::from_le_bytes(r), i as u64, "the fetched values of one initiator count up");
        if i % 256 == 255 {
            while w.cq.read(&mut [shmfab::CqTaggedEntry::default(); 64]).is_ok() {}
        }
    }
    w.barrier();
    assert_eq!(mem.buf[0], PER as u64, "the previous rank's adds all landed");
    w.barrier();
}

#[test]
fn crossed_mailboxes_never_wait_on_each_other() {
    run(
        "crossed_mailboxes_never_wait_on_each_other",
        3,
        &[("SHMFAB_CMA", "off")],
        Duration::from_secs(60),
        crossed_mailboxes,
    );
}

/// Calls of several remote segments in one registration: the
/// remote-event counters count each once (not once per segment), and one
/// refused segment (out of range) refuses the whole call, the other
/// segments untouched.
fn multi_segment_calls(w: World) {
    const LEN: usize = 4096;
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(LEN, RW).unwrap();
        let user = user_mem(&w, LEN, RW);
        let (cw, cr) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        for mr in [&heap, &user.mr] {
            mr.bind_counter(&cw, FI_REMOTE_WRITE).unwrap();
            mr.bind_counter(&cr, FI_REMOTE_READ).unwrap();
        }
        share(&w, "keys", &[heap.key(), user.mr.key()], 0);
        w.barrier();
        // Per region: writemsg, atomicmsg and fetch_atomicmsg write;
        // readmsg and fetch_atomicmsg read; the refused two count nowhere.
        let t0 = Instant::now();
        let now = || (cw.read().unwrap(), cr.read().unwrap());
        while now() != (2 * 3, 2 * 2) {
            w.dom.progress().unwrap();
            assert!(t0.elapsed() < Duration::from_secs(20), "counters {:?}", now());
            std::thread::yield_now();
        }
        w.barrier();
        assert_eq!(now(), (6, 4));
        for b in [heap_bytes(&heap), user.bytes()] {
            assert_eq!(&b[0..32], &pattern(64, 1)[..32]);
            assert_eq!(&b[64..96], &pattern(64, 1)[32..]);
            assert!(b[128..160].iter().all(|&x| x == 0), "a refused writemsg wrote its first segment");
            assert_eq!(&b[256..264], &[2, 0, 0, 0, 2, 0, 0, 0]);
            assert!(b[512..516].iter().all(|&x| x == 0), "a refused atomicmsg applied its first segment");
        }
    } else {
        let k = share(&w, "keys", &[], 1);
        let dest = w.addrs[1];
        let le = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let src = pattern(64, 1);
        for &key in &k {
            let segs = [RmaIov { addr: 0, len: 32, key }, RmaIov { addr: 64, len: 32, key }];
            w.ep.writemsg(&[IoSlice::new(&src)], &segs, dest, 1, 0, 0).unwrap();
            w.wait_ctx(1).unwrap();
            let mut back = vec![0u8; 64];
            w.ep.readmsg(&mut [IoSliceMut::new(&mut back)], &segs, dest, 2, 0).unwrap();
            w.wait_ctx(2).unwrap();
            assert_eq!(back, src);
            let iocs = [RmaIoc { addr: 256, count: 1, key }, RmaIoc { addr: 260, count: 1, key }];
            w.ep.atomicmsg(AtomicType::Uint32, AtomicOp::Sum, &le(&[1, 1]), &iocs, dest, 3, 0, 0).unwrap();
            w.wait_ctx(3).unwrap();
            let mut r = vec![0u8; 8];
            w.ep.fetch_atomicmsg(AtomicType::Uint32, AtomicOp::Sum, &le(&[1, 1]), &mut r, &iocs, dest, 4, 0, 0)
                .unwrap();
            w.wait_ctx(4).unwrap();
            assert_eq!(r, le(&[1, 1]));
            // Refused: the second segment ends past the registration.
            let bad = [RmaIov { addr: 128, len: 32, key }, RmaIov { addr: LEN as u64 - 8, len: 32, key }];
            w.ep.writemsg(&[IoSlice::new(&src)], &bad, dest, 5, 0, 0).unwrap();
            assert_eq!(w.wait_ctx(5).unwrap_err().err, ErrorKind::Inval.errno());
            let bad = [RmaIoc { addr: 512, count: 1, key }, RmaIoc { addr: LEN as u64 - 2, count: 1, key }];
            w.ep.atomicmsg(AtomicType::Uint32, AtomicOp::Sum, &le(&[1, 1]), &bad, dest, 6, 0, 0).unwrap();
            assert_eq!(w.wait_ctx(6).unwrap_err().err, ErrorKind::Inval.errno());
        }
        w.barrier();
        w.barrier();
    }
    w.barrier();
}

cma_on_and_off!(multi_segment_calls_count_once, multi_segment_calls_count_once_cma_off, 2, &[], multi_segment_calls);

/// A counter bound to a registration cannot be closed (`Busy`, as when
/// bound to an endpoint) until the registration is closed or binds
/// another counter; a counter opened after a refused close does not take
/// the bound one's slot, so it counts nothing of the registration.
#[test]
fn counter_bound_to_a_registration_is_busy() {
    run("counter_bound_to_a_registration_is_busy", 1, &[], T, |w| {
        for user in [false, true] {
            let mut um = user.then(|| user_mem(&w, 4096, RW));
            let mut heap = (!user).then(|| w.dom.alloc_shared(4096, RW).unwrap());
            let mr: &MemoryRegion = um.as_ref().map(|u| &u.mr).or(heap.as_ref()).unwrap();
            let a = w.dom.cntr_open().unwrap();
            mr.bind_counter(&a, FI_REMOTE_WRITE | FI_REMOTE_READ).unwrap();
            assert_eq!(a.close().unwrap_err().kind(), ErrorKind::Busy);
            let b = w.dom.cntr_open().unwrap();
            assert_ne!(b.index(), a.index());
            w.ep.write(&[1u8; 8], w.addrs[0], 0, mr.key(), 1).unwrap();
            w.wait_ctx(1).unwrap();
            assert_eq!((a.read().unwrap(), b.read().unwrap()), (1, 0));
            // Rebinding the write direction to b releases a's write
            // binding only: a stays bound for reads.
            mr.bind_counter(&b, FI_REMOTE_WRITE).unwrap();
            assert_eq!(a.close().unwrap_err().kind(), ErrorKind::Busy);
            mr.bind_counter(&b, FI_REMOTE_READ).unwrap();
            a.close().unwrap();
            assert_eq!(b.close().unwrap_err().kind(), ErrorKind::Busy);
            match (um.as_mut(), heap.as_mut()) {
                (Some(u), _) => u.mr.close().unwrap(),
                (_, Some(h)) => h.close().unwrap(),
                _ => unreachable!(),
            }
            b.close().unwrap();
        }
    });
}

/// bind_counter refuses a closed registration (whose slot a newer one may
/// hold) and a closed counter (whose index a newer one may hold).
#[test]
fn bind_counter_refuses_closed_objects() {
    run("bind_counter_refuses_closed_objects", 1, &[], T, |w| {
        let mut old = w.dom.alloc_shared(4096, RW).unwrap();
        let c = w.dom.cntr_open().unwrap();
        old.close().unwrap();
        let fresh = w.dom.alloc_shared(4096, RW).unwrap();
        assert_eq!(old.bind_counter(&c, FI_REMOTE_WRITE).unwrap_err().kind(), ErrorKind::Inval);
        w.ep.write(&[1u8; 8], w.addrs[0], 0, fresh.key(), 1).unwrap();
        w.wait_ctx(1).unwrap();
        assert_eq!(c.read().unwrap(), 0, "the closed registration's bind reached the fresh one");
        let c2 = w.dom.cntr_open().unwrap();
        c2.close().unwrap();
        assert_eq!(fresh.bind_counter(&c2, FI_REMOTE_READ).unwrap_err().kind(), ErrorKind::Inval);
        // c2's index is free again: a new counter takes it and must not be
        // bound by the refused call.
        let c3 = w.dom.cntr_open().unwrap();
        assert_eq!(c3.index(), c2.index());
        c3.close().unwrap();
        c.close().unwrap();
    });
}

/// A close that a stopped initiator outlasts in the middle of a large
/// single-copy write: either close says `Ok` and nothing is written after
/// it, or it says `Busy` (the access may still land) and a later close
/// says `Ok` once the initiator has resumed and let go; in both cases a
/// registration made after the first close works (the late release of the
/// pin corrupted the slot's next registration before).
#[test]
fn close_outlasted_by_a_stopped_initiator() {
    run("close_outlasted_by_a_stopped_initiator", 2, &[], T, |w| {
        const LEN: usize = 256 << 20;
        if !cma_works() {
            eprintln!("single copy refused on this host: nothing to test");
            return;
        }
        if w.rank == 1 {
            let mut buf = vec![0u8; LEN];
            // SAFETY: buf outlives the registration (closed below, and the
            // test waits until close says Ok before touching buf).
            let mut mr = unsafe { w.dom.mr_reg(buf.as_mut_ptr(), LEN, RW).unwrap() };
            let pid0 = share(&w, "key", &[mr.key()], 0)[0] as i32;
            let t0 = Instant::now();
            // SAFETY: a volatile read of our buffer, which the peer writes.
            while unsafe { std::ptr::read_volatile(buf.as_ptr().add(LEN - 1)) } == 0 {
                assert!(t0.elapsed() < Duration::from_secs(30), "the peer's first write never landed");
                std::thread::yield_now();
            }
            std::thread::sleep(Duration::from_millis(30));
            // SAFETY: plain signals to our peer rank.
            unsafe { libc::kill(pid0, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(20));
            let first = mr.close();
            let mut small = vec![0u64; 512];
            // SAFETY: `small` outlives the registration (dropped after it).
            let mr2 = unsafe { w.dom.mr_reg(small.as_mut_ptr().cast(), 4096, RW).unwrap() };
            put_file("1.closed", "");
            // SAFETY: as above.
            unsafe { libc::kill(pid0, libc::SIGCONT) };
            match first {
                Ok(()) => eprintln!("close: Ok (no pin held when stopped)"),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
                    let t1 = Instant::now();
                    while let Err(e) = mr.close() {
                        assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
                        assert!(t1.elapsed() < Duration::from_secs(30), "the resumed initiator never let go");
                    }
                    eprintln!("close: Busy, then Ok after {:?}", t1.elapsed());
                }
            }
            // Close said Ok: nothing may write the buffer from now on.
            buf.iter_mut().for_each(|b| *b = 0);
            std::thread::sleep(Duration::from_millis(1000));
            let dirty = buf.iter().filter(|&&b| b != 0).count();
            assert_eq!(dirty, 0, "{dirty} bytes written after close said Ok");
            w.ep.write(&[1u8; 8], w.addrs[1], 0, mr2.key(), 9).unwrap();
            w.wait_ctx(9).unwrap();
            assert_eq!(small[0], u64::from_le_bytes([1; 8]));
            w.barrier();
        } else {
            let key = share(&w, "key", &[std::process::id() as u64], 1)[0];
            let data = vec![0x5au8; LEN];
            let mut i = 0;
            while !test_dir().join("1.closed").exists() {
                w.ep.write(&data, w.addrs[1], 0, key, 100 + i).unwrap();
                let _ = w.wait_ctx(100 + i);
                i += 1;
            }
            w.barrier();
        }
    });
}

/// Rank 1 allocates shared heap and dies by SIGKILL while rank 0 writes
/// it and fetch-adds on it in a loop (review finding 4 of issue 16): the
/// heap stays mapped at rank 0, yet both kinds of operation fail with
/// FI_EIO within a few seconds, and once they fail they keep failing.
fn heap_of_a_dead_target(w: World) {
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        share(&w, "key", &[heap.key()], 0);
        w.barrier();
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: plain syscall; this rank is expected to die so.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!();
    }
    let key = share(&w, "key", &[], 1)[0];
    w.barrier();
    let dest = w.addrs[1];
    let t0 = Instant::now();
    let (mut put_failed, mut fadd_failed) = (None, None);
    let mut ctx = 100usize;
    let mut ok_after_failure = 0;
    while put_failed.is_none() || fadd_failed.is_none() || t0.elapsed() < Duration::from_millis(1500) {
        assert!(t0.elapsed() < Duration::from_secs(10), "no error 10 s after the target died");
        ctx += 1;
        w.ep.write(&[7u8; 8], dest, 0, key, ctx).unwrap();
        match w.wait_ctx(ctx) {
            Ok(_) if put_failed.is_some() => ok_after_failure += 1,
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.err, ErrorKind::Io.errno(), "{e:?}");
                put_failed.get_or_insert(t0.elapsed());
            }
        }
        ctx += 1;
        let mut old = [0u8; 8];
        w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &1u64.to_ne_bytes(), &mut old, dest, 64, key, ctx)
            .unwrap();
        match w.wait_ctx(ctx) {
            Ok(_) if fadd_failed.is_some() => ok_after_failure += 1,
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e.err, ErrorKind::Io.errno(), "{e:?}");
                fadd_failed.get_or_insert(t0.elapsed());
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(ok_after_failure, 0, "an operation on the dead target's heap succeeded after one had failed");
    let (p, f) = (put_failed.unwrap(), fadd_failed.unwrap());
    assert!(p < Duration::from_secs(5) && f < Duration::from_secs(5), "put failed after {p:?}, fetch-add after {f:?}");
}

#[test]
fn heap_ops_on_a_dead_target_fail() {
    run_killing("heap_ops_on_a_dead_target_fail", 2, &[], T, &[1], heap_of_a_dead_target);
}

/// The same with named regions: the dead target's RMA file keeps its name
/// until cleaned, and could be mapped again.
#[test]
fn heap_ops_on_a_dead_target_fail_named_regions() {
    let env = [("SHMFAB_REGIONS", "named")];
    run_killing("heap_ops_on_a_dead_target_fail_named_regions", 2, &env, T, &[1], heap_of_a_dead_target);
}
/// Reads the completions of this rank until it holds `tx` transmit
/// completions of context `ctx` and `n` remote CQ data entries: the
/// latter, in arrival order (errors fail the test).
fn cq_data_entries(w: &World, ctx: usize, tx: usize, n: usize) -> Vec<CqTaggedEntry> {
    let (mut got, mut done) = (Vec::new(), 0);
    while got.len() < n || done < tx {
        let e = w.next().unwrap_or_else(|e| panic!("rank {}: error completion {e:?}", w.rank));
        if e.flags & FI_REMOTE_CQ_DATA != 0 {
            got.push(e);
        } else {
            assert_eq!(e.op_context, ctx, "an unexpected completion {e:?}");
            done += 1;
        }
    }
    assert!(w.cq.read(&mut [CqTaggedEntry::default(); 4]).is_err(), "more completions than operations");
    got
}

/// Calls `f` until it does not say -FI_EAGAIN, without driving progress
/// otherwise (the call serves our own mailbox itself); the tries.
fn again_without_progress(mut f: impl FnMut() -> shmfab::Result<()>) -> usize {
    let t0 = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        match f() {
            Err(e) if e.kind() == ErrorKind::Again => {
                assert!(t0.elapsed() < Duration::from_secs(30), "stuck on -FI_EAGAIN");
            }
            r => {
                r.unwrap();
                return tries;
            }
        }
    }
}

/// Remote CQ data to ourselves, many more than the mailbox has slots,
/// without reading the CQ in between (before: the 17th call spun forever
/// on a mailbox full of our own CQ data, which only a progress pass with
/// a CQ would free); then every entry, in order, with the flags of its
/// kind (atomics: FI_ATOMIC, not FI_RMA; an ATOMIC_READ: FI_REMOTE_READ).
fn writedata_to_self(w: World) {
    const N: u64 = 40;
    let heap = w.dom.alloc_shared(4096, RW).unwrap();
    let user = user_mem(&w, 4096, RW);
    let me = w.addrs[0];
    for (k, key) in [heap.key(), user.mr.key()].into_iter().enumerate() {
        for i in 0..N {
            w.ep.writedata(&i.to_le_bytes(), 1000 * k as u64 + i, me, 8 * i, key, 1).unwrap();
        }
        let one = 1u64.to_le_bytes();
        let iocs = [RmaIoc { addr: 512, count: 1, key }];
        let mut r = [0u8; 8];
        for i in 0..N {
            w.ep.atomicmsg(AtomicType::Uint64, AtomicOp::Sum, &one, &iocs, me, 1, 5000 + i, FI_REMOTE_CQ_DATA).unwrap();
        }
        w.ep.fetch_atomicmsg(AtomicType::Uint64, AtomicOp::Read, &[], &mut r, &iocs, me, 1, 9, FI_REMOTE_CQ_DATA)
            .unwrap();
        assert_eq!(u64::from_le_bytes(r), N);
        let got = cq_data_entries(&w, 1, 2 * N as usize + 1, 2 * N as usize + 1);
        for (i, e) in got.iter().enumerate().take(N as usize) {
            assert_eq!((e.data, e.len), (1000 * k as u64 + i as u64, 8), "entry {i}");
            assert_eq!(e.flags, FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA);
        }
        for (i, e) in got[N as usize..2 * N as usize].iter().enumerate() {
            assert_eq!((e.data, e.len), (5000 + i as u64, 8), "atomic entry {i}");
            assert_eq!(e.flags, FI_ATOMIC | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA);
        }
        assert_eq!(got[2 * N as usize].flags, FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_CQ_DATA);
        assert_eq!(got[2 * N as usize].data, 9);
    }
    let b = heap_bytes(&heap);
    for i in 0..N as usize {
        assert_eq!(b[8 * i..8 * i + 8], (i as u64).to_le_bytes());
        assert_eq!(user.bytes()[8 * i..8 * i + 8], (i as u64).to_le_bytes());
    }
}

cma_on_and_off!(
    writedata_to_self_without_progress,
    writedata_to_self_without_progress_cma_off,
    1,
    &[],
    writedata_to_self
);

/// Two ranks do many writedata to each other at once, neither reading its
/// CQ until all are done (before: both spun forever once the other's
/// mailbox was full); then every entry arrives, in order.
fn writedata_crossed(w: World) {
    const N: u64 = 60;
    let user = user_mem(&w, 4096, RW);
    let other = 1 - w.rank;
    let key = share(&w, "key", &[user.mr.key()], other)[0];
    w.barrier();
    for i in 0..N {
        again_without_progress(|| w.ep.writedata(&i.to_le_bytes(), i, w.addrs[other], 8 * i, key, 1));
    }
    let got = cq_data_entries(&w, 1, N as usize, N as usize);
    for (i, e) in got.iter().enumerate() {
        assert_eq!((e.data, e.flags), (i as u64, FI_RMA | FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA), "entry {i}");
    }
    for i in 0..N as usize {
        assert_eq!(user.bytes()[8 * i..8 * i + 8], (i as u64).to_le_bytes());
    }
    w.barrier();
}

cma_on_and_off!(
    writedata_crossed_without_progress,
    writedata_crossed_without_progress_cma_off,
    2,
    &[],
    writedata_crossed
);

/// A target that runs no progress: once its mailbox is full of our CQ
/// data, the next writedata fails with -FI_EAGAIN in bounded time having
/// done nothing (its data not written); once the target reads its CQ, the
/// retry goes through (before: the call spun forever holding the lock).
fn full_mailbox_says_again(w: World) {
    let slots = 16u64;
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        share(&w, "key", &[heap.key()], 1);
        // No progress until rank 0 says it filled our mailbox (a file).
        share(&w, "wait", &[], 0);
        let got = cq_data_entries(&w, usize::MAX, 0, slots as usize);
        for (i, e) in got.iter().enumerate() {
            assert_eq!(e.data, i as u64);
        }
        w.barrier();
        w.barrier(); // rank 0 retries meanwhile
        assert_eq!(cq_data_entries(&w, usize::MAX, 0, 1)[0].data, slots);
        assert_eq!(heap_bytes(&heap)[8 * slots as usize], 1);
    } else {
        let key = share(&w, "key", &[], 1)[0];
        let dest = w.addrs[1];
        for i in 0..slots {
            w.ep.writedata(&[1], i, dest, 8 * i, key, 1).unwrap();
        }
        let t0 = Instant::now();
        let r = w.ep.writedata(&[1], slots, dest, 8 * slots, key, 1);
        assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::Again), "a 17th writedata into a full mailbox");
        assert!(t0.elapsed() < Duration::from_secs(5), "bounded: {:?}", t0.elapsed());
        let mut b = [0u8; 1];
        w.ep.read(&mut b, dest, 8 * slots, key, 2).unwrap();
        w.ok(2);
        assert_eq!(b[0], 0, "the refused writedata wrote nothing");
        share(&w, "wait", &[1], 0);
        w.barrier();
        w.retry(|| w.ep.writedata(&[1], slots, dest, 8 * slots, key, 1));
        w.barrier();
        for _ in 0..=slots {
            w.ok(1);
        }
    }
    w.barrier();
}

#[test]
fn full_mailbox_says_again_not_spins() {
    run("full_mailbox_says_again_not_spins", 2, &[], Duration::from_secs(60), full_mailbox_says_again);
}

/// Inject calls take at most inject_size bytes: inject_atomic and the msg
/// forms with FI_INJECT say -FI_EMSGSIZE above it (before: inject_atomic
/// took 8192 bytes, writemsg with FI_INJECT any length), leaving the
/// target untouched; at the limit they work.
fn inject_limits(w: World) {
    let heap = w.dom.alloc_shared(16384, RW).unwrap();
    let (me, key) = (w.addrs[0], heap.key());
    let lim = shmfab::rma::RMA_INJECT_SIZE;
    let big = vec![1u8; lim + 1];
    let r = w.ep.inject_atomic(AtomicType::Uint8, AtomicOp::Sum, &big, me, 0, key);
    assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::MsgSize));
    let iocs = [RmaIoc { addr: 0, count: lim + 1, key }];
    let r = w.ep.atomicmsg(AtomicType::Uint8, AtomicOp::Sum, &big, &iocs, me, 1, 0, shmfab::FI_INJECT);
    assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::MsgSize));
    let rma = [RmaIov { addr: 0, len: lim + 1, key }];
    let r = w.ep.writemsg(&[IoSlice::new(&big)], &rma, me, 1, 0, shmfab::FI_INJECT);
    assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::MsgSize));
    assert!(heap_bytes(&heap).iter().all(|&b| b == 0), "a refused inject touched the target");
    w.ep.inject_atomic(AtomicType::Uint8, AtomicOp::Sum, &big[..lim], me, 0, key).unwrap();
    let rma = [RmaIov { addr: 8192, len: lim, key }];
    w.ep.writemsg(&[IoSlice::new(&big[..lim])], &rma, me, 1, 0, shmfab::FI_INJECT).unwrap();
    w.ok(1);
    let b = heap_bytes(&heap);
    assert!(b[..lim].iter().all(|&b| b == 1) && b[lim] == 0 && b[8192..8192 + lim].iter().all(|&b| b == 1));
}

#[test]
fn inject_calls_take_at_most_inject_size() {
    run("inject_calls_take_at_most_inject_size", 1, &[], Duration::from_secs(30), inject_limits);
}

/// FI_FENCE: a fenced write waits until this endpoint's earlier
/// operations to that peer are complete: while a rendezvous send to it
/// awaits the peer's receive, the fenced call says -FI_EAGAIN (an
/// unfenced one goes through); once the send completes, it goes through
/// (before: FI_FENCE was taken and did nothing).
fn fenced_rma(w: World) {
    const BIG: usize = 8 << 20;
    let heap = w.dom.alloc_shared(4096, RW).unwrap();
    let key = share(&w, "key", &[heap.key()], 1 - w.rank)[0];
    w.barrier();
    if w.rank == 0 {
        let dest = w.addrs[1];
        let msg = vec![7u8; BIG];
        // SAFETY: msg outlives the send's completion (waited for below).
        unsafe { w.ep.tsend(&msg, dest, 5, 50).unwrap() };
        let rma = [RmaIov { addr: 0, len: 8, key }];
        let one = [IoSlice::new(&[1u8; 8])];
        let r = w.ep.writemsg(&one, &rma, dest, 51, 0, shmfab::FI_FENCE);
        assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::Again), "fenced behind a pending rendezvous send");
        let r = w.ep.atomicmsg(
            AtomicType::Uint8,
            AtomicOp::Sum,
            &[1],
            &[RmaIoc { addr: 8, count: 1, key }],
            dest,
            51,
            0,
            shmfab::FI_FENCE,
        );
        assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::Again));
        assert!(heap_bytes_of(&w, dest, key) == [0u8; 16], "a refused fenced call wrote");
        w.ep.writemsg(&one, &rma, dest, 52, 0, 0).unwrap();
        w.ok(52);
        w.barrier(); // rank 1 receives now
        w.retry(|| w.ep.writemsg(&[IoSlice::new(&[2u8; 8])], &rma, dest, 53, 0, shmfab::FI_FENCE));
        w.ok(50);
        w.ok(53);
    } else {
        w.barrier();
        let mut buf = vec![0u8; BIG];
        // SAFETY: buf outlives the receive (waited for below).
        unsafe { w.ep.trecv(&mut buf, w.addrs[0], 5, 0, 60).unwrap() };
        w.ok(60);
        assert!(buf.iter().all(|&b| b == 7));
    }
    w.barrier();
    if w.rank == 1 {
        assert_eq!(heap_bytes(&heap)[..9], [2, 2, 2, 2, 2, 2, 2, 2, 0]);
    }
    w.barrier();
}

/// 16 bytes at offset 0 of the registration `key` of `dest`, read.
fn heap_bytes_of(w: &World, dest: shmfab::FiAddr, key: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    w.ep.read(&mut b, dest, 0, key, 99).unwrap();
    w.ok(99);
    b
}

cma_on_and_off!(fence_waits_for_earlier_sends, fence_waits_for_earlier_sends_cma_off, 2, &[], fenced_rma);

/// A peer that used a heap registration (fetch-adds, a put) and then sits
/// idle, making no call at all, holds nothing: the owner's close says Ok
/// at once, not Busy after the drain limit (2 s); the data and the
/// remote-event counters are exact; the peer's operations after the close
/// fail with FI_ENOKEY and touch neither the counters nor a new
/// registration that took the old one's slot and heap range.
fn close_with_an_idle_peer(w: World) {
    const N: u64 = 1000;
    const DRAIN: Duration = Duration::from_secs(2);
    let wait_file = |name: &str| {
        let t0 = Instant::now();
        while !test_dir().join(name).exists() {
            assert!(t0.elapsed() < Duration::from_secs(30), "{name} never came");
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    if w.rank == 1 {
        let mut heap = w.dom.alloc_shared(4096, RW).unwrap();
        let (cw, cr) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        heap.bind_counter(&cw, FI_REMOTE_WRITE).unwrap();
        heap.bind_counter(&cr, FI_REMOTE_READ).unwrap();
        share(&w, "key", &[heap.key()], 0);
        wait_file("0.idle");
        let b = heap_bytes(&heap);
        assert_eq!(u64::from_le_bytes(b[..8].try_into().unwrap()), N);
        assert_eq!(&b[8..16], &[9u8; 8]);
        assert_eq!((cw.read().unwrap(), cr.read().unwrap()), (N + 1, N));
        let t0 = Instant::now();
        heap.close().unwrap();
        let took = t0.elapsed();
        assert!(took < DRAIN, "close waited {took:?} for an idle peer");
        let fresh = w.dom.alloc_shared(4096, RW).unwrap();
        put_file("1.closed", "");
        wait_file("0.done");
        assert!(heap_bytes(&fresh).iter().all(|&x| x == 0), "a new registration written with an old key");
        assert_eq!((cw.read().unwrap(), cr.read().unwrap()), (N + 1, N), "a refused access counted");
        w.barrier();
    } else {
        let key = share(&w, "key", &[], 1)[0];
        let dest = w.addrs[1];
        let mut r = [0u8; 8];
        for i in 0..N {
            w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &1u64.to_ne_bytes(), &mut r, dest, 0, key, 5).unwrap();
            w.wait_ctx(5).unwrap();
            assert_eq!(u64::from_ne_bytes(r), i);
        }
        w.ep.write(&[9u8; 8], dest, 8, key, 6).unwrap();
        w.wait_ctx(6).unwrap();
        // Idle: no call into shmfab until the target closed.
        put_file("0.idle", "");
        wait_file("1.closed");
        r = [7u8; 8];
        w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &1u64.to_ne_bytes(), &mut r, dest, 0, key, 7).unwrap();
        assert_eq!(w.wait_ctx(7).unwrap_err().err, ErrorKind::NoKey.errno());
        assert_eq!(r, [7u8; 8], "a refused fetch-add returned a value");
        w.ep.write(&[9u8; 8], dest, 8, key, 8).unwrap();
        assert_eq!(w.wait_ctx(8).unwrap_err().err, ErrorKind::NoKey.errno());
        put_file("0.done", "");
        w.barrier();
    }
}

#[test]
fn close_with_an_idle_peer_is_prompt() {
    run("close_with_an_idle_peer_is_prompt", 2, &[], T, close_with_an_idle_peer);
}

/// An initiator killed (SIGKILL, by a thread of its own, at any point of
/// its loop, maybe in the middle of an access) while it fetch-adds on a
/// heap registration: the owner's close says Ok (a dead process's
/// initiator record holds nothing: it writes nothing more), and the word
/// holds at least what the dead rank saw done.
fn initiator_dies(w: World) {
    if w.rank == 1 {
        let mut heap = w.dom.alloc_shared(4096, RW).unwrap();
        let pid0 = share(&w, "key", &[heap.key()], 0)[0] as i32;
        let t0 = Instant::now();
        // SAFETY: probes of our peer rank's pid.
        while unsafe { libc::kill(pid0, 0) } == 0 {
            assert!(t0.elapsed() < Duration::from_secs(30), "rank 0 never died");
            std::thread::sleep(Duration::from_millis(1));
        }
        let seen: u64 = std::fs::read_to_string(test_dir().join("0.seen")).unwrap().parse().unwrap();
        let word = u64::from_le_bytes(heap_bytes(&heap)[..8].try_into().unwrap());
        assert!(word >= seen && word > 0, "word {word}, seen {seen}");
        let t1 = Instant::now();
        heap.close().unwrap();
        assert!(t1.elapsed() < Duration::from_secs(2), "close waited {:?} for a dead initiator", t1.elapsed());
    } else {
        let key = share(&w, "key", &[std::process::id() as u64], 1)[0];
        let dest = w.addrs[1];
        let mut r = [0u8; 8];
        for _ in 0..2000 {
            w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &1u64.to_ne_bytes(), &mut r, dest, 0, key, 5).unwrap();
            w.wait_ctx(5).unwrap();
        }
        put_file("0.seen", &(u64::from_ne_bytes(r) + 1).to_string());
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: plain syscall; this rank is expected to die so.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
        loop {
            w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &1u64.to_ne_bytes(), &mut r, dest, 0, key, 5).unwrap();
            while w.cq.read(&mut [CqTaggedEntry::default(); 64]).is_ok() {}
        }
    }
}

#[test]
fn close_after_an_initiator_died() {
    run_killing("close_after_an_initiator_died", 2, &[], T, &[0], initiator_dies);
}

/// The initiator's target cache never serves a stale entry: fetch-adds
/// alternating between two targets each land on their own word; a
/// registration closed and replaced is refused by its old key and
/// reached by its new one; an fi_addr removed from the AV fails the call,
/// and the same peers inserted again (in the other order) are reached
/// by their new fi_addrs, each on its own memory.
fn target_cache_never_stale(w: World) {
    let fadd = |dest, key, ctx| {
        let mut r = [0u8; 8];
        w.ep.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &1u64.to_le_bytes(), &mut r, dest, 8, key, ctx)?;
        Ok::<_, shmfab::Error>((w.wait_ctx(ctx).map(drop), u64::from_le_bytes(r)))
    };
    if w.rank != 0 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        share(&w, &format!("key{}", w.rank), &[heap.key()], 0);
        w.barrier();
        // Rank 1 replaces its registration; rank 2 keeps its own.
        let _kept = if w.rank == 1 {
            drop(heap);
            let h = w.dom.alloc_shared(4096, RW).unwrap();
            share(&w, "key1b", &[h.key()], 0);
            h
        } else {
            heap
        };
        share(&w, "done", &[], 0);
        return;
    }
    let k1 = share(&w, "key1", &[], 1)[0];
    let k2 = share(&w, "key2", &[], 2)[0];
    let (a1, a2) = (w.addrs[1], w.addrs[2]);
    for i in 0..200u64 {
        let (dest, key) = if i % 2 == 0 { (a1, k1) } else { (a2, k2) };
        assert_eq!(fadd(dest, key, 10).unwrap(), (Ok(()), i / 2), "op {i}");
    }
    w.barrier();
    let k1b = share(&w, "key1b", &[], 1)[0];
    assert_ne!(k1b, k1);
    // The closed registration's key is refused (a retry while rank 1's
    // close is in progress may still see it: wait until it is gone).
    let t0 = Instant::now();
    while fadd(a1, k1, 11).unwrap().0.is_ok() {
        assert!(t0.elapsed() < Duration::from_secs(20), "a closed registration still reached by its key");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(fadd(a1, k1b, 12).unwrap(), (Ok(()), 0));
    assert_eq!(fadd(a2, k2, 13).unwrap(), (Ok(()), 100));
    let (p1, p2) = (w.av.lookup(a1).unwrap(), w.av.lookup(a2).unwrap());
    w.av.remove(&[a1, a2]).unwrap();
    let e = fadd(a1, k1b, 14).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoEnt, "{e:?}");
    assert!(fadd(a2, k2, 15).is_err());
    let again = w.av.insert(&[p2, p1]).unwrap();
    let (b2, b1) = (again[0], again[1]);
    assert_eq!(fadd(b1, k1b, 16).unwrap(), (Ok(()), 1));
    assert_eq!(fadd(b2, k2, 17).unwrap(), (Ok(()), 101));
    // Alternating again through the new fi_addrs.
    for i in 0..20u64 {
        let (dest, key, base) = if i % 2 == 0 { (b1, k1b, 2) } else { (b2, k2, 102) };
        assert_eq!(fadd(dest, key, 18).unwrap(), (Ok(()), base + i / 2), "op {i}");
    }
    share(&w, "done", &[1], 0);
}

#[test]
fn target_cache_never_serves_a_stale_entry() {
    run("target_cache_never_serves_a_stale_entry", 3, &[], T, target_cache_never_stale);
}

/// A [`shmfab::HeapTarget`] (a heap registration resolved once): its
/// writes, reads and atomics land as the endpoint's do; a key of no
/// registration, memory that is not heap, a range past the registration,
/// a missing right and an unaligned atomic are refused with the target
/// untouched; the target's remote-event counters count exactly what
/// landed; after the target closes the registration, nothing lands and
/// every call fails (never one succeeding after a failure).
fn heap_target(w: World) {
    if w.rank == 1 {
        let mut heap = w.dom.alloc_shared(4096, RW).unwrap();
        let ro = w.dom.alloc_shared(64, FI_REMOTE_READ).unwrap();
        let user = user_mem(&w, 64, RW);
        let (cw, cr) = (w.dom.cntr_open().unwrap(), w.dom.cntr_open().unwrap());
        heap.bind_counter(&cw, FI_REMOTE_WRITE).unwrap();
        heap.bind_counter(&cr, FI_REMOTE_READ).unwrap();
        share(&w, "keys", &[heap.key(), ro.key(), user.mr.key()], 0);
        w.barrier();
        // 100 writes, 10 fetch-adds and a compare-swap (both), 1 atomic
        // write, 5 reads.
        let t0 = Instant::now();
        let now = || (cw.read().unwrap(), cr.read().unwrap());
        while now() != (112, 16) {
            w.dom.progress().unwrap();
            assert!(t0.elapsed() < Duration::from_secs(20), "counters {:?}", now());
        }
        let b = heap_bytes(&heap);
        assert_eq!(&b[..8], &99u64.to_ne_bytes());
        assert_eq!(&b[64..72], &(10u64 | 0x100).to_ne_bytes());
        assert_eq!(&b[72..80], &[2; 8]);
        assert!(b[80..].iter().all(|&x| x == 0), "a refused access wrote the heap");
        assert!(heap_bytes(&ro).iter().all(|&x| x == 0), "a write landed in a read-only registration");
        w.barrier();
        // Close while the initiator writes through its handle.
        let t1 = Instant::now();
        while heap_bytes(&heap)[8] == 0 {
            assert!(t1.elapsed() < Duration::from_secs(20), "the writes never came");
            w.dom.progress().unwrap();
        }
        heap.close().unwrap();
        let fresh = w.dom.alloc_shared(4096, RW).unwrap();
        let t2 = Instant::now();
        while t2.elapsed() < Duration::from_millis(300) {
            w.dom.progress().unwrap();
        }
        assert!(heap_bytes(&fresh).iter().all(|&b| b == 0), "new heap registration written with an old handle");
        put_file("1.closed", "");
        w.barrier();
    } else {
        let k = share(&w, "keys", &[], 1);
        let dest = w.addrs[1];
        let kind = |r: shmfab::Result<()>| r.unwrap_err().kind();
        let bad = k[0] ^ 0xffff_0000_0000 ^ 1;
        assert_eq!(w.ep.heap_target(dest, bad).unwrap_err().kind(), ErrorKind::NoKey);
        assert_eq!(w.ep.heap_target(dest, k[2]).unwrap_err().kind(), ErrorKind::OpNotSupp);
        let h = w.ep.heap_target(dest, k[0]).unwrap();
        assert_eq!((h.key(), h.len()), (k[0], 4096));
        for i in 0..100u64 {
            h.write(0, &i.to_ne_bytes()).unwrap();
        }
        let one = 1u64.to_ne_bytes();
        let mut old = [0u8; 8];
        for i in 0..10u64 {
            h.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut old, 64).unwrap();
            assert_eq!(u64::from_ne_bytes(old), i);
        }
        h.atomic(AtomicType::Uint64, AtomicOp::Bor, &0x100u64.to_ne_bytes(), 64).unwrap();
        let mut got = [0u8; 8];
        for _ in 0..5 {
            h.read(0, &mut got).unwrap();
            assert_eq!(got, 99u64.to_ne_bytes());
        }
        let mut cmp_old = [9u8; 8];
        h.compare_atomic(AtomicType::Uint64, AtomicOp::Cswap, &[2; 8], &[0; 8], &mut cmp_old, 72).unwrap();
        assert_eq!(cmp_old, [0; 8]);
        // Refused, nothing written, nothing counted.
        assert_eq!(kind(h.write(4090, &[1; 8])), ErrorKind::Inval);
        assert_eq!(kind(h.write(u64::MAX - 2, &[1; 8])), ErrorKind::Inval);
        assert_eq!(kind(h.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut old, 4092)), ErrorKind::Inval);
        assert_eq!(kind(h.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut old, 84)), ErrorKind::Inval);
        assert_eq!(kind(h.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one[..4], &mut old, 88)), ErrorKind::Inval);
        let ro = w.ep.heap_target(dest, k[1]).unwrap();
        assert_eq!(kind(ro.write(0, &[1; 8])), ErrorKind::Perm);
        assert_eq!(kind(ro.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut old, 0)), ErrorKind::Perm);
        ro.read(0, &mut got).unwrap();
        assert_eq!(got, [0; 8]);
        w.barrier();
        w.barrier();
        let mut failed = false;
        let t0 = Instant::now();
        while !test_dir().join("1.closed").exists() {
            match h.write(8, &[0xa5; 8]) {
                Ok(()) => assert!(!failed, "a write succeeded after one failed for a closed key"),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::NoKey, "{e}");
                    failed = true;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(30));
        }
        assert!(failed, "writes to a closed registration succeeded");
        w.barrier();
    }
}

#[test]
fn heap_target_checks_and_counts() {
    run("heap_target_checks_and_counts", 2, &[], T, heap_target);
}

/// A [`shmfab::HeapTarget`] to a target that dies fails with FI_EIO within
/// about `peer_check`, and nothing succeeds after the first failure.
fn heap_target_of_a_dead_target(w: World) {
    if w.rank == 1 {
        let heap = w.dom.alloc_shared(4096, RW).unwrap();
        share(&w, "key", &[heap.key()], 0);
        w.barrier();
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: plain syscall; this rank is expected to die so.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        unreachable!();
    }
    let key = share(&w, "key", &[], 1)[0];
    w.barrier();
    let h = w.ep.heap_target(w.addrs[1], key).unwrap();
    let t0 = Instant::now();
    let mut failed = None;
    let mut ok_after_failure = 0;
    while failed.is_none() || t0.elapsed() < Duration::from_millis(1500) {
        assert!(t0.elapsed() < Duration::from_secs(10), "no error 10 s after the target died");
        let mut old = [0u8; 8];
        for r in [
            h.write(0, &[7u8; 8]),
            h.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &1u64.to_ne_bytes(), &mut old, 64),
        ] {
            match r {
                Ok(()) if failed.is_some() => ok_after_failure += 1,
                Ok(()) => {}
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
                    failed.get_or_insert(t0.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(ok_after_failure, 0, "an operation on the dead target's heap succeeded after one had failed");
    assert!(failed.unwrap() < Duration::from_secs(5), "failed after {:?}", failed);
}

#[test]
fn heap_target_of_a_dead_target_fails() {
    run_killing("heap_target_of_a_dead_target_fails", 2, &[], T, &[1], heap_target_of_a_dead_target);
}

/// The target cache's last-hit path follows the AV: after the fi_addr of
/// a peer is removed, a write to it is refused (never sent to the old
/// peer), and once the fi_addr names another peer, writes go to that one
/// (in one process: three domains).
#[test]
fn last_target_follows_the_av() {
    std::env::set_var("SHMFAB_JOB_ID", format!("rma-last-hit-{}", std::process::id()));
    let fab = shmfab::Fabric::open().unwrap();
    let (d0, d1, d2) = (fab.domain().unwrap(), fab.domain().unwrap(), fab.domain().unwrap());
    let (cq, av) = (d0.cq_open(&Default::default()).unwrap(), d0.av_open().unwrap());
    let ep0 = d0.endpoint().unwrap();
    ep0.bind_cq(&cq, shmfab::FI_TRANSMIT | shmfab::FI_RECV).unwrap();
    ep0.bind_av(&av).unwrap();
    ep0.enable().unwrap();
    let (ep1, ep2) = (d1.endpoint().unwrap(), d2.endpoint().unwrap());
    let (h1, h2) = (d1.alloc_shared(64, RW).unwrap(), d2.alloc_shared(64, RW).unwrap());
    let wait = || {
        let mut e = [CqTaggedEntry::default()];
        let t0 = Instant::now();
        loop {
            match cq.read(&mut e) {
                Ok(1) => return Ok(()),
                Err(x) if x.kind() == ErrorKind::Avail => return Err(cq.readerr().unwrap()),
                _ => assert!(t0.elapsed() < Duration::from_secs(10), "no completion"),
            }
        }
    };
    let a = av.insert(&[ep1.getname()]).unwrap()[0];
    for i in 0..3u8 {
        ep0.write(&[i + 1; 8], a, 0, h1.key(), 1).unwrap();
        wait().unwrap();
    }
    assert_eq!(&heap_bytes(&h1)[..8], &[3; 8]);
    av.remove(&[a]).unwrap();
    let e = ep0.write(&[9; 8], a, 0, h1.key(), 1).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NoEnt, "{e}");
    let b = av.insert(&[ep2.getname()]).unwrap()[0];
    for i in 0..3u8 {
        ep0.write(&[i + 5; 8], b, 8, h2.key(), 1).unwrap();
        wait().unwrap();
    }
    assert_eq!(&heap_bytes(&h2)[8..16], &[7; 8]);
    assert!(heap_bytes(&h2)[..8].iter().all(|&x| x == 0));
    assert_eq!(&heap_bytes(&h1)[..16], &[[3u8; 8], [0; 8]].concat()[..], "a write went to the removed peer");
    // A HeapTarget of a closed endpoint refuses every call.
    let h = ep0.heap_target(b, h2.key()).unwrap();
    h.write(16, &[1; 8]).unwrap();
    ep0.close().unwrap();
    assert_eq!(h.write(24, &[1; 8]).unwrap_err().kind(), ErrorKind::Inval);
    let mut got = [7u8; 8];
    assert_eq!(h.read(0, &mut got).unwrap_err().kind(), ErrorKind::Inval);
    assert_eq!(got, [7; 8], "a read through a closed endpoint moved data");
    let one = 1u64.to_ne_bytes();
    let e = h.atomic(AtomicType::Uint64, AtomicOp::Sum, &one, 24).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Inval);
    let e = h.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut got, 24).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Inval);
    let e = h.compare_atomic(AtomicType::Uint64, AtomicOp::Cswap, &one, &one, &mut got, 24).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Inval);
    assert!(heap_bytes(&h2)[24..].iter().all(|&x| x == 0), "an access landed through a closed endpoint");
}

/// The endpoint calls' last hit is the same endpoint's: an endpoint and
/// its AV closed and opened again take the same section index and AV
/// slot, and the new AV reaches the same generation with one insert, so
/// the same fi_addr of the new pair (another peer) must not find the old
/// pair's target (the review of session 13 found writes, their counts
/// and remote CQ data going to the old peer).
#[test]
fn last_target_is_the_endpoints_own() {
    std::env::set_var("SHMFAB_JOB_ID", format!("rma-last-reuse-{}", std::process::id()));
    let fab = shmfab::Fabric::open().unwrap();
    let (d0, d1) = (fab.domain().unwrap(), fab.domain().unwrap());
    let heap = d1.alloc_shared(64, RW).unwrap();
    // Two target endpoints of d1, each counting the remote writes that
    // reach it.
    let target = |c: &shmfab::Counter| {
        let (ep, cq, av) = (d1.endpoint().unwrap(), d1.cq_open(&Default::default()).unwrap(), d1.av_open().unwrap());
        ep.bind_cq(&cq, shmfab::FI_TRANSMIT | shmfab::FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.bind_cntr(c, FI_REMOTE_WRITE).unwrap();
        ep.enable().unwrap();
        (ep, cq, av)
    };
    let (ca, cb) = (d1.cntr_open().unwrap(), d1.cntr_open().unwrap());
    let (ea, qa, _aa) = target(&ca);
    let (eb, qb, _ab) = target(&cb);
    let cq = d0.cq_open(&Default::default()).unwrap();
    let wait = || {
        let mut e = [CqTaggedEntry::default()];
        let t0 = Instant::now();
        loop {
            match cq.read(&mut e) {
                Ok(1) => return,
                Err(x) if x.kind() == ErrorKind::Avail => panic!("{:?}", cq.readerr().unwrap()),
                _ => assert!(t0.elapsed() < Duration::from_secs(10), "no completion"),
            }
        }
    };
    let pair = || {
        let (av, ep) = (d0.av_open().unwrap(), d0.endpoint().unwrap());
        ep.bind_cq(&cq, shmfab::FI_TRANSMIT | shmfab::FI_RECV).unwrap();
        ep.bind_av(&av).unwrap();
        ep.enable().unwrap();
        (av, ep)
    };
    {
        let (av, ep) = pair();
        let a = av.insert(&[ea.getname()]).unwrap()[0];
        ep.write(&[1; 8], a, 0, heap.key(), 1).unwrap();
        wait();
        ep.close().unwrap();
        av.close().unwrap();
    }
    assert_eq!((ca.read().unwrap(), cb.read().unwrap()), (1, 0));
    let (av, ep) = pair();
    let b = av.insert(&[eb.getname()]).unwrap()[0];
    assert_eq!(b, 0, "the test needs the same fi_addr again");
    ep.write(&[2; 8], b, 0, heap.key(), 1).unwrap();
    wait();
    assert_eq!((ca.read().unwrap(), cb.read().unwrap()), (1, 1), "the write was counted at the old peer");
    ep.writedata(&[3; 8], 0xfeed, b, 8, heap.key(), 2).unwrap();
    wait();
    // The CQ data goes through d1's mailbox: d1's progress (the reads
    // below) delivers it.
    let mut e = [CqTaggedEntry::default()];
    let t0 = Instant::now();
    let (mut na, mut nb) = (0, 0);
    while nb == 0 && t0.elapsed() < Duration::from_secs(10) {
        d1.progress().unwrap();
        na += qa.read(&mut e).unwrap_or(0);
        if let Ok(1) = qb.read(&mut e) {
            assert_eq!(e[0].data, 0xfeed);
            nb += 1;
        }
    }
    na += qa.read(&mut e).unwrap_or(0);
    assert_eq!((na, nb), (0, 1), "remote CQ data at the old peer's endpoint");
    assert_eq!((ca.read().unwrap(), cb.read().unwrap()), (1, 2));
    assert_eq!(&heap_bytes(&heap)[..16], &[[2u8; 8], [3; 8]].concat()[..]);
}
