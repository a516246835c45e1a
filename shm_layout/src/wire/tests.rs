//! Round trips and boundaries of every format, and a fuzz of every decoder:
//! arbitrary bytes and headers, and mutations of valid encodings (truncated,
//! bits flipped, fields set to extreme values, lengths that overflow). Each
//! decoder's answer is compared with a plain restatement of its format
//! (`*_spec`, in 128-bit arithmetic): it must accept exactly the valid
//! inputs, and what it returns must be what the bytes say.

extern crate std;

use super::*;
use crate::rts_flags;
use std::vec::Vec;

const MAX: u64 = 1 << 40;

fn r(addr: u64, len: u64) -> IovRange {
    IovRange { addr, len }
}

fn hdr(op: u8, len: u32, tag: u64, data: u64) -> MsgHdr {
    MsgHdr { op, flags: 0, ncells: 0, len, tag, data }
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

// ---- Round trips and boundaries.

#[test]
fn bounce_hdr_round_trips_and_checks() {
    let mut buf = [0u8; 40];
    for v in [BounceHdr { msg_id: 1, total: 1 }, BounceHdr { msg_id: u64::MAX, total: MAX }] {
        assert_eq!(v.encode(&mut buf), Ok(16));
        assert_eq!(BounceHdr::decode(&buf[..16], MAX), Ok(v));
        assert_eq!(BounceHdr::decode(&buf, MAX), Ok(v), "bytes past the format are ignored");
        assert_eq!(BounceHdr::decode(&buf[..15], MAX), Err(WireError::Short { need: 16, got: 15 }));
    }
    let enc = |v: BounceHdr| {
        let mut b = [0u8; 16];
        v.encode(&mut b).unwrap();
        b
    };
    assert_eq!(BounceHdr::decode(&enc(BounceHdr { msg_id: 0, total: 5 }), MAX), Err(WireError::ZeroMsgId));
    assert_eq!(BounceHdr::decode(&enc(BounceHdr { msg_id: 3, total: 0 }), MAX), Err(WireError::Empty));
    assert_eq!(
        BounceHdr::decode(&enc(BounceHdr { msg_id: 3, total: MAX + 1 }), MAX),
        Err(WireError::TooLarge { total: MAX + 1, max: MAX })
    );
    assert_eq!(BounceHdr::decode(&[], MAX), Err(WireError::Short { need: 16, got: 0 }));
    assert_eq!(BounceHdr { msg_id: 1, total: 1 }.encode(&mut [0u8; 15]), Err(WireError::NoRoom { need: 16, have: 15 }));
}

#[test]
fn chunk_round_trips_and_checks() {
    let v = Chunk { msg_id: 9, offset: 1 << 33, len: 32768, index: 31 };
    let mut buf = [0u8; 8];
    let (h, n) = v.encode(&mut buf).unwrap();
    assert_eq!(n, 4);
    assert_eq!((h.op, h.len, h.tag, h.data), (op::CHUNK, 32768, 9, 1 << 33));
    assert_eq!(Chunk::decode(&h, &buf[..n], 32, 32768), Ok(v));
    assert_eq!(Chunk::decode(&h, &buf[..3], 32, 32768), Err(WireError::Short { need: 4, got: 3 }));
    assert_eq!(Chunk::decode(&h, &buf[..n], 31, 32768), Err(WireError::ChunkIndex(31)));
    assert_eq!(Chunk::decode(&h, &buf[..n], 32, 32767), Err(WireError::ChunkLen { index: 31, len: 32768 }));
    let h0 = MsgHdr { len: 0, ..h };
    assert_eq!(Chunk::decode(&h0, &buf[..n], 32, 32768), Err(WireError::ChunkLen { index: 31, len: 0 }));
    let wrong = MsgHdr { op: op::FIN, ..h };
    assert_eq!(Chunk::decode(&wrong, &buf[..n], 32, 32768), Err(WireError::WrongOp(op::FIN)));
    assert_eq!(v.encode(&mut [0u8; 3]), Err(WireError::NoRoom { need: 4, have: 3 }));
    // A chunk of a message's first bytes, id 0 included: the caller checks
    // both against the message in progress.
    let h1 = hdr(op::CHUNK, 1, 0, 0);
    assert_eq!(Chunk::decode(&h1, &[0, 0, 0, 0], 1, 4096), Ok(Chunk { msg_id: 0, offset: 0, len: 1, index: 0 }));
}

#[test]
fn chunk_runs_stay_inside_the_pool() {
    // A run of chunks from `index`: as many as the length needs, at most
    // MAX_RUN, and none past the pool's end.
    let dec = |index: u32, len: u32, n_chunks: u32| {
        let mut buf = [0u8; 4];
        let (h, _) = Chunk { msg_id: 2, offset: 0, len, index }.encode(&mut buf).unwrap();
        Chunk::decode(&h, &buf, n_chunks, 4096)
    };
    let ok = |index, len| Ok(Chunk { msg_id: 2, offset: 0, len, index });
    assert_eq!(dec(0, 16 * 4096, 16), ok(0, 16 * 4096), "the whole pool, MAX_RUN chunks");
    assert_eq!(dec(0, 16 * 4096 + 1, 64), Err(WireError::ChunkLen { index: 0, len: 16 * 4096 + 1 }), "over MAX_RUN");
    assert_eq!(dec(12, 4 * 4096, 16), ok(12, 4 * 4096), "the last four");
    assert_eq!(
        dec(12, 4 * 4096 + 1, 16),
        Err(WireError::ChunkLen { index: 12, len: 4 * 4096 + 1 }),
        "one byte past the end"
    );
    assert_eq!(dec(15, 4097, 16), Err(WireError::ChunkLen { index: 15, len: 4097 }));
    assert_eq!(dec(3, u32::MAX, u32::MAX), Err(WireError::ChunkLen { index: 3, len: u32::MAX }), "no overflow");
    assert_eq!(ok(0, 4097).unwrap().run(4096), 2);
    assert_eq!(ok(0, 4096).unwrap().run(4096), 1);
    assert_eq!(ok(0, 16 * 4096).unwrap().run(4096), Chunk::MAX_RUN);
}

#[test]
fn rts_round_trips_and_checks() {
    let mut buf = [0u8; Rts::MAX_WIRE + 10];
    let one = Rts::new(1, 0, 0, [r(0, 0)]).unwrap();
    let full = Rts::new(u64::MAX, MAX, rts_flags::CMA, [r(1, MAX - 3), r(2, 1), r(3, 1), r(u64::MAX, 1)]).unwrap();
    for v in [one, full] {
        let n = v.encode(&mut buf).unwrap();
        assert_eq!(n, Rts::HEAD + v.niov as usize * 16);
        assert_eq!(Rts::decode(&buf[..n], MAX), Ok(v));
        assert_eq!(Rts::decode(&buf, MAX), Ok(v), "bytes past the ranges are ignored");
        assert_eq!(Rts::decode(&buf[..n - 1], MAX), Err(WireError::Short { need: n, got: n - 1 }));
    }
    assert_eq!(full.iovs().len(), MAX_IOV);
    assert_eq!(Rts::new(1, 5, 0, [r(0, 1); MAX_IOV + 1]), Err(WireError::BadCount(MAX_IOV as u32 + 1)));
    let enc = |v: &Rts, b: &mut [u8]| v.encode(b).unwrap();
    // The limit is the caller's.
    let n = enc(&full, &mut buf);
    assert_eq!(Rts::decode(&buf[..n], MAX - 1), Err(WireError::TooLarge { total: MAX, max: MAX - 1 }));
    // Lengths that overflow, with the total their wrapped sum.
    let ov = Rts::new(5, 2, 0, [r(0, u64::MAX), r(0, 3)]).unwrap();
    let n = enc(&ov, &mut buf);
    assert_eq!(Rts::decode(&buf[..n], u64::MAX), Err(WireError::LengthMismatch));
    let short_sum = Rts::new(5, 10, 0, [r(0, 4), r(0, 5)]).unwrap();
    let n = enc(&short_sum, &mut buf);
    assert_eq!(Rts::decode(&buf[..n], MAX), Err(WireError::LengthMismatch));
    let zero = Rts::new(0, 1, 0, [r(0, 1)]).unwrap();
    let n = enc(&zero, &mut buf);
    assert_eq!(Rts::decode(&buf[..n], MAX), Err(WireError::ZeroMsgId));
    // Counts out of bounds, and a count that promises more than is there.
    let n = enc(&one, &mut buf);
    for bad in [0u32, MAX_IOV as u32 + 1, u32::MAX] {
        buf[16..20].copy_from_slice(&bad.to_le_bytes());
        assert_eq!(Rts::decode(&buf[..n], MAX), Err(WireError::BadCount(bad)));
    }
    buf[16..20].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(Rts::decode(&buf[..n], MAX), Err(WireError::Short { need: 56, got: 40 }));
    assert_eq!(Rts::decode(&buf[..23], MAX), Err(WireError::Short { need: 24, got: 23 }));
    // Encoding checks what it must to write the bytes.
    assert_eq!(full.encode(&mut [0u8; Rts::MAX_WIRE - 1]), Err(WireError::NoRoom { need: 88, have: 87 }));
    assert_eq!(Rts { niov: 5, ..one }.encode(&mut buf), Err(WireError::BadCount(5)));
    assert_eq!(Rts { niov: u32::MAX, ..one }.iovs().len(), MAX_IOV);
}

#[test]
fn cts_write_round_trips_and_checks() {
    let mut buf = [0u8; CtsWrite::MAX_WIRE + 3];
    let none = CtsWrite::new(1, u64::MAX, []).unwrap();
    let full = CtsWrite::new(77, 8192, [r(10, 4096), r(20, 1), r(30, 0), r(40, 5)]).unwrap();
    for v in [none, full] {
        let (h, n) = v.encode(&mut buf).unwrap();
        assert_eq!((h.op, h.len, h.tag, h.data), (op::CTS_WRITE, 0, v.msg_id, v.offset));
        assert_eq!(n, CtsWrite::HEAD + 16 * v.n as usize);
        assert_eq!(CtsWrite::decode(&h, &buf[..n]), Ok(v));
        assert_eq!(CtsWrite::decode(&h, &buf), Ok(v), "bytes past the ranges are ignored");
        assert_eq!(CtsWrite::decode(&h, &buf[..n - 1]), Err(WireError::Short { need: n, got: n - 1 }));
    }
    assert_eq!(full.total(), 4102);
    assert_eq!(none.total(), 0);
    // The reserved word is not checked, and reads as zero.
    let (h, n) = full.encode(&mut buf).unwrap();
    buf[4] = 0xff;
    assert_eq!(CtsWrite::decode(&h, &buf[..n]), Ok(full));
    // Offset plus total past u64, and lengths that overflow.
    let (h, n) = CtsWrite::new(3, u64::MAX, [r(0, 1)]).unwrap().encode(&mut buf).unwrap();
    assert_eq!(CtsWrite::decode(&h, &buf[..n]), Err(WireError::Overflow));
    let (h, n) = CtsWrite::new(3, 0, [r(0, u64::MAX), r(0, 1)]).unwrap().encode(&mut buf).unwrap();
    assert_eq!(CtsWrite::decode(&h, &buf[..n]), Err(WireError::LengthMismatch));
    let (h, n) = full.encode(&mut buf).unwrap();
    assert_eq!(CtsWrite::decode(&MsgHdr { tag: 0, ..h }, &buf[..n]), Err(WireError::ZeroMsgId));
    assert_eq!(CtsWrite::decode(&MsgHdr { op: op::RTS, ..h }, &buf[..n]), Err(WireError::WrongOp(op::RTS)));
    buf[..4].copy_from_slice(&(MAX_IOV as u32 + 1).to_le_bytes());
    assert_eq!(CtsWrite::decode(&h, &buf[..n]), Err(WireError::BadCount(MAX_IOV as u32 + 1)));
    assert_eq!(CtsWrite::decode(&h, &buf[..3]), Err(WireError::Short { need: 4, got: 3 }));
    assert_eq!(full.encode(&mut [0u8; 71]), Err(WireError::NoRoom { need: 72, have: 71 }));
    assert_eq!(CtsWrite { n: 5, ..none }.encode(&mut buf), Err(WireError::BadCount(5)));
    assert_eq!(CtsWrite::new(1, 0, [r(0, 1); 5]), Err(WireError::BadCount(5)));
}

#[test]
fn control_round_trips_and_checks() {
    for kind in [CtrlKind::CtsBounce, CtrlKind::Fin, CtrlKind::Wdone] {
        for (status, msg_id) in [(0, 1), (u32::MAX, u64::MAX), (5, 12)] {
            let c = Control { kind, status, msg_id };
            let h = c.encode();
            assert_eq!((h.op, h.len, h.tag, h.flags, h.data), (kind as u8, status, msg_id, 0, 0));
            assert_eq!(Control::decode(&h), Ok(c));
        }
        assert_eq!(Control::decode(&hdr(kind as u8, 0, 0, 0)), Err(WireError::ZeroMsgId));
    }
    assert_eq!((CtrlKind::CtsBounce as u8, CtrlKind::Fin as u8, CtrlKind::Wdone as u8), (5, 6, 8));
    for o in [0, op::EAGER, op::BOUNCE_HDR, op::CHUNK, op::RTS, op::CTS_WRITE, 9, 255] {
        assert_eq!(Control::decode(&hdr(o, 0, 1, 0)), Err(WireError::WrongOp(o)));
    }
}

#[test]
fn errors_say_what() {
    extern crate alloc;
    use alloc::string::ToString;
    assert_eq!(WireError::ChunkIndex(40).what(), "chunk index out of range");
    assert_eq!(WireError::ChunkLen { index: 1, len: 0 }.what(), "chunk length out of range");
    assert_eq!(
        WireError::Short { need: 24, got: 3 }.to_string(),
        "message shorter than its format: 3 bytes, 24 needed"
    );
    assert_eq!(WireError::ZeroMsgId.to_string(), "message id zero");
}

// ---- The fuzz.

/// Cases per decoder.
const CASES: usize = 200_000;

/// splitmix64: a small deterministic generator (the same cases each run).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
    /// A u64 that is often on an edge.
    fn u64(&mut self) -> u64 {
        const EDGES: [u64; 12] =
            [0, 1, 2, 3, 4095, 4096, MAX - 1, MAX, MAX + 1, i64::MAX as u64, u64::MAX - 1, u64::MAX];
        match self.below(4) {
            0 => EDGES[self.below(EDGES.len() as u64) as usize],
            1 => self.below(1 << 16),
            _ => self.next(),
        }
    }
    /// A u32 that is often on an edge.
    fn u32(&mut self) -> u32 {
        const EDGES: [u32; 12] = [0, 1, 2, 3, 4, 5, 8, 31, 32, 0x7fff_ffff, 0x8000_0000, u32::MAX];
        match self.below(3) {
            0 => EDGES[self.below(EDGES.len() as u64) as usize],
            1 => self.below(1 << 16) as u32,
            _ => self.next() as u32,
        }
    }
    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        let n = self.below(max_len + 1) as usize;
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// A header: any op (often a real one), fields often on an edge.
    fn hdr(&mut self, likely_op: u8) -> MsgHdr {
        let op = match self.below(4) {
            0 => self.next() as u8,
            1 => 1 + self.below(8) as u8,
            _ => likely_op,
        };
        MsgHdr {
            op,
            flags: self.next() as u8,
            ncells: self.next() as u16,
            len: self.u32(),
            tag: self.u64(),
            data: self.u64(),
        }
    }
    /// Lengths summing to `total`, `n` of them.
    fn split(&mut self, total: u64, n: usize) -> Vec<u64> {
        let mut left = total;
        let mut v = Vec::new();
        for k in 0..n {
            let l = if k + 1 == n { left } else { self.below(left.saturating_add(1).max(1)) };
            v.push(l);
            left -= l;
        }
        v
    }
    /// Damages an encoding: cuts it, flips bits, sets a field to an edge,
    /// or adds bytes.
    fn mutate(&mut self, b: &mut Vec<u8>) {
        for _ in 0..1 + self.below(3) {
            match self.below(6) {
                0 => {
                    let n = self.below(b.len() as u64 + 1) as usize;
                    b.truncate(n);
                }
                1 if !b.is_empty() => {
                    let i = self.below(b.len() as u64) as usize;
                    b[i] ^= 1 << self.below(8);
                }
                2 if b.len() >= 8 => {
                    let i = 4 * self.below(b.len() as u64 / 4 - 1) as usize;
                    b[i..i + 8].copy_from_slice(&self.u64().to_le_bytes());
                }
                3 if b.len() >= 4 => {
                    let i = 4 * self.below(b.len() as u64 / 4) as usize;
                    b[i..i + 4].copy_from_slice(&self.u32().to_le_bytes());
                }
                4 => {
                    let extra = self.bytes(32);
                    b.extend_from_slice(&extra);
                }
                _ => {}
            }
        }
    }
    fn max(&mut self) -> u64 {
        if self.chance(2) {
            MAX
        } else {
            self.u64()
        }
    }
}

/// Counts of accepted and refused inputs: both must be common, or the
/// generator is not reaching one side of a decoder.
#[derive(Default)]
struct Tally {
    ok: usize,
    err: usize,
}

impl Tally {
    fn add<T>(&mut self, r: &Result<T, WireError>) {
        if r.is_ok() {
            self.ok += 1
        } else {
            self.err += 1
        }
    }
    fn check(&self, name: &str) {
        assert_eq!(self.ok + self.err, CASES, "{name}");
        assert!(self.ok >= CASES / 20 && self.err >= CASES / 20, "{name}: {} accepted, {} refused", self.ok, self.err);
    }
}

/// What the bounce header format accepts, restated.
fn bounce_spec(b: &[u8], max: u64) -> Option<BounceHdr> {
    if b.len() < 16 {
        return None;
    }
    let (msg_id, total) = (le64(b, 0), le64(b, 8));
    (msg_id != 0 && total != 0 && total <= max).then_some(BounceHdr { msg_id, total })
}

#[test]
fn fuzz_bounce_hdr() {
    let mut rng = Rng(1);
    let mut t = Tally::default();
    for _ in 0..CASES {
        let max = rng.max();
        let b = if rng.chance(3) {
            rng.bytes(200)
        } else {
            let v = BounceHdr { msg_id: 1 + rng.u64() % u64::MAX, total: 1 + rng.below(max.max(1)) };
            let mut b = std::vec![0u8; BounceHdr::WIRE];
            assert_eq!(v.encode(&mut b), Ok(16));
            if max > 0 {
                assert_eq!(BounceHdr::decode(&b, max), Ok(v));
            }
            if rng.chance(2) {
                rng.mutate(&mut b);
            }
            b
        };
        let got = BounceHdr::decode(&b, max);
        t.add(&got);
        assert_eq!(got.ok(), bounce_spec(&b, max), "{b:?} max {max}");
        if let Ok(v) = got {
            let mut e = [0u8; 16];
            v.encode(&mut e).unwrap();
            assert_eq!(e[..], b[..16]);
        }
    }
    t.check("bounce header");
}

fn chunk_spec(h: &MsgHdr, b: &[u8], n_chunks: u32, chunk_size: usize) -> Result<Chunk, Option<u32>> {
    if h.op != op::CHUNK || b.len() < 4 {
        return Err(None);
    }
    let index = le32(b, 0);
    if index >= n_chunks {
        return Err(None);
    }
    // A run of up to MAX_RUN chunks, none past the pool's end.
    let run = (n_chunks - index).min(Chunk::MAX_RUN) as u128;
    if h.len == 0 || h.len as u128 > chunk_size as u128 * run {
        return Err(Some(index));
    }
    Ok(Chunk { msg_id: h.tag, offset: h.data, len: h.len, index })
}

#[test]
fn fuzz_chunk() {
    let mut rng = Rng(2);
    let mut t = Tally::default();
    for _ in 0..CASES {
        let n_chunks = if rng.chance(2) { 32 } else { rng.u32() };
        let chunk_size = if rng.chance(2) { 32768 } else { rng.u64() as usize };
        let (h, b) = if rng.chance(3) {
            (rng.hdr(op::CHUNK), rng.bytes(200))
        } else {
            let v = Chunk {
                msg_id: rng.u64(),
                offset: rng.u64(),
                len: 1 + rng.below(chunk_size.clamp(1, u32::MAX as usize) as u64) as u32,
                index: rng.below(n_chunks.max(1) as u64) as u32,
            };
            let mut b = std::vec![0u8; Chunk::WIRE];
            let (mut h, n) = v.encode(&mut b).unwrap();
            assert_eq!(n, 4);
            if n_chunks > 0 && chunk_size > 0 {
                assert_eq!(Chunk::decode(&h, &b, n_chunks, chunk_size), Ok(v));
            }
            if rng.chance(2) {
                rng.mutate(&mut b);
            }
            if rng.chance(3) {
                h.len = rng.u32();
            }
            if rng.chance(8) {
                h.op = rng.next() as u8;
            }
            (h, b)
        };
        let got = Chunk::decode(&h, &b, n_chunks, chunk_size);
        t.add(&got);
        match (got, chunk_spec(&h, &b, n_chunks, chunk_size)) {
            (Ok(v), Ok(s)) => {
                assert_eq!(v, s);
                let mut e = [0u8; 4];
                let (eh, _) = v.encode(&mut e).unwrap();
                assert_eq!((eh.op, eh.len, eh.tag, eh.data), (h.op, h.len, h.tag, h.data));
                assert_eq!(e[..], b[..4]);
            }
            // A refused chunk whose index is ours is named, to be freed.
            (Err(WireError::ChunkLen { index, len }), Err(Some(i))) => assert_eq!((index, len), (i, h.len)),
            (Err(e), Err(None)) => assert!(!matches!(e, WireError::ChunkLen { .. }), "{e:?}"),
            (got, spec) => panic!("{h:?} {b:?} {n_chunks} {chunk_size}: decoded {got:?}, expected {spec:?}"),
        }
    }
    t.check("chunk");
}

fn rts_spec(b: &[u8], max: u64) -> Option<Rts> {
    if b.len() < 24 {
        return None;
    }
    let (msg_id, total, niov, flags) = (le64(b, 0), le64(b, 8), le32(b, 16), le32(b, 20));
    let n = niov as usize;
    if msg_id == 0 || niov == 0 || n > MAX_IOV || b.len() < 24 + 16 * n || total > max {
        return None;
    }
    let mut iov = [IovRange::default(); MAX_IOV];
    let mut sum = 0u128;
    for (k, slot) in iov.iter_mut().take(n).enumerate() {
        *slot = r(le64(b, 24 + 16 * k), le64(b, 32 + 16 * k));
        sum += slot.len as u128;
    }
    (sum == total as u128).then_some(Rts { msg_id, total, niov, flags, iov })
}

#[test]
fn fuzz_rts() {
    let mut rng = Rng(3);
    let mut t = Tally::default();
    for _ in 0..CASES {
        let max = rng.max();
        let b = if rng.chance(3) {
            rng.bytes(200)
        } else {
            let n = 1 + rng.below(MAX_IOV as u64) as usize;
            let total = rng.below(max.saturating_add(1).max(1));
            let mut lens = rng.split(total, n);
            let mut stated = total;
            let overflows = n > 1 && rng.chance(4);
            if overflows {
                // Overflowing lengths whose wrapped sum is the total.
                lens[0] = u64::MAX - rng.below(16);
                lens[1] = lens[1].max(16);
                stated = lens.iter().fold(0u64, |a, l| a.wrapping_add(*l));
            }
            let v = Rts::new(1 + rng.u64() % u64::MAX, stated, rng.u32(), lens.iter().map(|&l| r(rng.next(), l)));
            let v = v.unwrap();
            let mut b = std::vec![0u8; Rts::HEAD + 16 * n];
            assert_eq!(v.encode(&mut b), Ok(b.len()));
            if !overflows {
                assert_eq!(Rts::decode(&b, max), Ok(v));
            } else {
                assert_eq!(Rts::decode(&b, u64::MAX), Err(WireError::LengthMismatch));
            }
            if rng.chance(2) {
                rng.mutate(&mut b);
            }
            b
        };
        let got = Rts::decode(&b, max);
        t.add(&got);
        assert_eq!(got.ok(), rts_spec(&b, max), "{b:?} max {max}");
        if let Ok(v) = got {
            let mut e = [0u8; Rts::MAX_WIRE];
            let n = v.encode(&mut e).unwrap();
            assert_eq!(e[..n], b[..n]);
        }
    }
    t.check("rts");
}

fn cts_write_spec(h: &MsgHdr, b: &[u8]) -> Option<CtsWrite> {
    if h.op != op::CTS_WRITE || h.tag == 0 || b.len() < 4 {
        return None;
    }
    let n = le32(b, 0) as usize;
    if n > MAX_IOV || b.len() < 8 + 16 * n {
        return None;
    }
    let mut ranges = [IovRange::default(); MAX_IOV];
    let mut sum = 0u128;
    for (k, slot) in ranges.iter_mut().take(n).enumerate() {
        *slot = r(le64(b, 8 + 16 * k), le64(b, 16 + 16 * k));
        sum += slot.len as u128;
    }
    let fits = sum <= u64::MAX as u128 && h.data as u128 + sum <= u64::MAX as u128;
    fits.then_some(CtsWrite { msg_id: h.tag, offset: h.data, n: n as u32, reserved: 0, ranges })
}

#[test]
fn fuzz_cts_write() {
    let mut rng = Rng(4);
    let mut t = Tally::default();
    for _ in 0..CASES {
        let (h, b) = if rng.chance(3) {
            (rng.hdr(op::CTS_WRITE), rng.bytes(200))
        } else {
            let n = rng.below(MAX_IOV as u64 + 1) as usize;
            let offset = if rng.chance(4) { rng.u64() } else { rng.below(MAX) };
            let room = u64::MAX - offset;
            let total = rng.below(room.saturating_add(1).max(1));
            let mut lens = rng.split(total, n);
            if n > 1 && rng.chance(4) {
                lens[0] = u64::MAX - rng.below(16); // the sum overflows
            }
            let v = CtsWrite::new(1 + rng.u64() % u64::MAX, offset, lens.iter().map(|&l| r(rng.next(), l))).unwrap();
            let mut b = std::vec![0u8; CtsWrite::HEAD + 16 * n];
            let (mut h, len) = v.encode(&mut b).unwrap();
            assert_eq!(len, b.len());
            if cts_write_spec(&h, &b).is_some() {
                assert_eq!(CtsWrite::decode(&h, &b), Ok(v));
            }
            if rng.chance(2) {
                rng.mutate(&mut b);
            }
            if rng.chance(4) {
                h.data = rng.u64();
            }
            if rng.chance(8) {
                h.tag = rng.u64();
            }
            if rng.chance(8) {
                h.op = rng.next() as u8;
            }
            (h, b)
        };
        let got = CtsWrite::decode(&h, &b);
        t.add(&got);
        assert_eq!(got.ok(), cts_write_spec(&h, &b), "{h:?} {b:?}");
        if let Ok(v) = got {
            assert_eq!(v.total() as u128, v.ranges().iter().map(|r| r.len as u128).sum::<u128>());
            assert!(v.offset.checked_add(v.total()).is_some());
            let mut e = [0u8; CtsWrite::MAX_WIRE];
            let (eh, n) = v.encode(&mut e).unwrap();
            assert_eq!((eh.op, eh.tag, eh.data), (h.op, h.tag, h.data));
            // All but the reserved word, which is written zero.
            assert_eq!((&e[..4], &e[8..n]), (&b[..4], &b[8..n]));
        }
    }
    t.check("cts_write");
}

#[test]
fn fuzz_control() {
    let mut rng = Rng(5);
    let mut t = Tally::default();
    for _ in 0..CASES {
        let h = if rng.chance(2) {
            rng.hdr(op::FIN)
        } else {
            let kind = [CtrlKind::CtsBounce, CtrlKind::Fin, CtrlKind::Wdone][rng.below(3) as usize];
            let c = Control { kind, status: rng.u32(), msg_id: 1 + rng.u64() % u64::MAX };
            let mut h = c.encode();
            assert_eq!(Control::decode(&h), Ok(c));
            match rng.below(4) {
                0 => h.op = rng.next() as u8,
                1 => h.tag = rng.u64(),
                _ => {}
            }
            h
        };
        let got = Control::decode(&h);
        t.add(&got);
        let valid = matches!(h.op, op::CTS_BOUNCE | op::FIN | op::WDONE) && h.tag != 0;
        assert_eq!(got.is_ok(), valid, "{h:?}");
        if let Ok(c) = got {
            assert_eq!((c.kind as u8, c.status, c.msg_id), (h.op, h.len, h.tag));
            let e = c.encode();
            assert_eq!((e.op, e.len, e.tag, e.flags, e.data), (h.op, h.len, h.tag, 0, 0));
        }
    }
    t.check("control");
}
