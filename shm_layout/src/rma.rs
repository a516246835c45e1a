//! The RMA file of a domain: its memory-registration table, the shared
//! heap and the mailbox through which the owner's progress engine serves
//! one-sided operations that peers cannot do themselves. A file apart
//! from the domain's region (whose layout it leaves alone), made on the
//! first registration, checked on attach against its own magic and
//! [`RMA_VERSION`] and against the domain region's job and token.
//!
//! ```text
//! RmaHeader (one page)
//! MrEntry[n_mr]              registration table (keys name a slot)
//! AtomicLock[N_LOCKS]        striped locks of the 16-byte atomics
//! MboxSlot[n_mbox]           requests to the owner's progress engine
//! IniRecord[N_INI]           initiators' records (heap accesses in progress)
//! heap (heap_len bytes)      shared heap: offsets, never pointers
//! ```
//!
//! Everything a peer wrote is decoded by [`MboxReq::decode`] or checked
//! against the file's size before use.

use crate::sync::{AtomicU32, AtomicU64};
use crate::PAGE;

/// Magic of an RMA file (published last, with release).
pub const RMA_MAGIC: u64 = u64::from_le_bytes(*b"SHMFABRM");
/// Layout version of the RMA file.
pub const RMA_VERSION: u32 = 4;
/// What an initiator writes where its pid goes (a mailbox slot's
/// claimer, a 16-byte atomic's lock) when it runs in another PID
/// namespace than the file's owner: a pid no process of the owner's
/// namespace can check, so such a claim or lock is never taken over.
pub const PID_UNKNOWN: u32 = u32::MAX;
/// Registration slots per domain.
pub const N_MR: u32 = 1024;
/// Mailbox slots per domain.
pub const N_MBOX: u32 = 16;
/// Payload bytes of one mailbox slot.
pub const MBOX_DATA: usize = 16 * 1024;
/// Striped locks of the 16-byte atomics.
pub const N_LOCKS: usize = 64;
/// Segments of one registration.
pub const MR_SEGS: usize = 4;
/// Initiator records per RMA file.
pub const N_INI: usize = 256;

/// Header of the RMA file.
#[repr(C, align(4096))]
pub struct RmaHeader {
    /// [`RMA_MAGIC`] once initialised.
    pub magic: AtomicU64,
    /// [`RMA_VERSION`].
    pub version: u32,
    /// Owner's uid.
    pub uid: u32,
    /// Job hash of the owner's domain region.
    pub job: u32,
    /// Token of the owner's domain region.
    pub token: u32,
    /// Registration slots.
    pub n_mr: u32,
    /// Mailbox slots.
    pub n_mbox: u32,
    /// Offset of the heap.
    pub heap_off: u64,
    /// Bytes of heap.
    pub heap_len: u64,
    /// Size of the whole file.
    pub total: u64,
    /// The owner's PID namespace (inode of /proc/self/ns/pid; 0 unknown):
    /// the pids in claimers and locks are of this namespace.
    pub pid_ns: u64,
    /// Requests published to the mailbox so far: initiators add one after
    /// each (release), the owner's progress compares it with what it
    /// served (one load per pass).
    pub requests: AtomicU64,
    /// Per endpoint section: the counters bound to the endpoint with
    /// FI_REMOTE_WRITE (`[0]`) and FI_REMOTE_READ (`[1]`), index + 1 (0:
    /// none); published when the endpoint is enabled, cleared on close.
    pub ep_cntr: [[AtomicU32; 2]; MAX_EP_CNTR],
}

/// Endpoint sections whose remote counters the header publishes.
pub const MAX_EP_CNTR: usize = 256;

/// Kinds of registration.
pub mod mr_kind {
    /// Memory of the shared heap: segment 0's address is a heap offset.
    pub const HEAP: u32 = 1;
    /// The owner's private memory: segment addresses are its virtual
    /// addresses (reached by single copy or through the mailbox).
    pub const USER: u32 = 2;
}

/// One registration. `ctl` is `tag << 32 | pins << 1 | open`: a peer pins
/// the entry with a CAS that needs its key's tag and the open bit (or,
/// for a shared-heap access it checked before, marks its [`IniRecord`]
/// busy and loads `ctl`, writing nothing here); the owner writes the
/// other fields only while the entry is closed, unpinned and no record
/// is busy on it, then publishes them by setting `ctl` with release.
#[repr(C, align(64))]
pub struct MrEntry {
    /// Tag, pin count, open bit.
    pub ctl: AtomicU64,
    /// [`mr_kind`].
    pub kind: u32,
    /// Remote rights (FI_REMOTE_READ, FI_REMOTE_WRITE bits, as u32 >> 12).
    pub access: u32,
    /// Total bytes.
    pub len: u64,
    /// Segments used.
    pub nseg: u32,
    /// Counter index + 1 counting remote writes (0: none). Atomic: a
    /// bind changes it while the registration is open and in use.
    pub cntr_rw: AtomicU32,
    /// Counter index + 1 counting remote reads (0: none). Atomic, as
    /// `cntr_rw`.
    pub cntr_rr: AtomicU32,
    /// Unused.
    pub reserved: u32,
    /// (address or heap offset, length) of each segment.
    pub seg: [[u64; 2]; MR_SEGS],
}

/// Bits of [`MrEntry::access`].
pub mod mr_access {
    /// Peers may read.
    pub const REMOTE_READ: u32 = 1;
    /// Peers may write (atomics need it, and read for fetches).
    pub const REMOTE_WRITE: u32 = 2;
}

/// The record of one initiator (a process's mapping of the file): while
/// it accesses a shared-heap registration without pinning it, the
/// record names the registration's slot. `word` is `pid << 32 | busy`:
/// 0 free; claimed by a CAS from 0 (or from a dead pid's word); `busy`
/// is 0 when idle, else the slot + 1 accessed. The claimer sets `busy`
/// with an acquire-release swap before it checks the entry's `ctl`, and
/// clears it with a release swap after the access (every write to the
/// word is an RMW); a close, after clearing the
/// open bit, reads each record with a read-modify-write (so that either
/// it sees the access, or the access sees the open bit cleared), and
/// waits for those busy on its slot, ignoring dead pids.
#[repr(C, align(64))]
pub struct IniRecord {
    /// `pid << 32 | busy`.
    pub word: AtomicU64,
}

/// A spin lock word (16-byte atomics).
#[repr(C, align(64))]
pub struct AtomicLock {
    /// 0 free, else the holder's pid.
    pub word: AtomicU32,
}

/// States of a mailbox slot (the low bits of [`MboxSlot::word`]).
pub mod mbox_state {
    /// Free.
    pub const FREE: u32 = 0;
    /// Claimed by an initiator, being written.
    pub const CLAIMED: u32 = 1;
    /// Request published, for the owner to serve.
    pub const REQ: u32 = 2;
    /// Served: status and results are in place.
    pub const DONE: u32 = 3;
}

/// The word of a mailbox slot: its state, a generation and its claimer,
/// changed together (one CAS), so that whoever frees a slot of a dead
/// claimer frees exactly the claim it judged, never a later one. Layout:
/// `claimer << 32 | generation << 2 | state`; the generation (30 bits)
/// grows at each claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotWord(pub u64);

impl SlotWord {
    /// The word of a slot in `state` at generation `generation` (taken
    /// modulo 2^30), claimed by `claimer` (0 when free).
    pub const fn new(state: u32, generation: u32, claimer: u32) -> SlotWord {
        SlotWord((claimer as u64) << 32 | ((generation & 0x3fff_ffff) as u64) << 2 | (state & 3) as u64)
    }
    /// [`mbox_state`].
    pub const fn state(self) -> u32 {
        (self.0 & 3) as u32
    }
    /// Generation: the number of claims of the slot, modulo 2^30.
    pub const fn generation(self) -> u32 {
        ((self.0 >> 2) & 0x3fff_ffff) as u32
    }
    /// Pid of the claimer (0: none), in the owner's PID namespace, or
    /// [`PID_UNKNOWN`].
    pub const fn claimer(self) -> u32 {
        (self.0 >> 32) as u32
    }
    /// The same claim in another state.
    pub const fn with_state(self, state: u32) -> SlotWord {
        SlotWord::new(state, self.generation(), self.claimer())
    }
    /// The word of this slot freed (same generation, no claimer).
    pub const fn freed(self) -> SlotWord {
        SlotWord::new(mbox_state::FREE, self.generation(), 0)
    }
    /// The word of a new claim of this (free) slot by `claimer`.
    pub const fn claimed_by(self, claimer: u32) -> SlotWord {
        SlotWord::new(mbox_state::CLAIMED, self.generation().wrapping_add(1), claimer)
    }
}

/// What remote CQ data reports ([`MboxReq::aop`] of a CQ_DATA request):
/// the owner maps it to completion flags, never taking flags from a peer.
pub mod cq_kind {
    /// An RMA write (FI_RMA | FI_REMOTE_WRITE).
    pub const RMA_WRITE: u8 = 0;
    /// An atomic that wrote (FI_ATOMIC | FI_REMOTE_WRITE).
    pub const ATOMIC_WRITE: u8 = 1;
    /// An atomic that only read (ATOMIC_READ: FI_ATOMIC | FI_REMOTE_READ).
    pub const ATOMIC_READ: u8 = 2;
}

/// Operations of a mailbox request.
pub mod mbox_op {
    /// Write `len` bytes of the data into the registration.
    pub const WRITE: u8 = 1;
    /// Read `len` bytes of the registration into the data.
    pub const READ: u8 = 2;
    /// Atomic on `count` elements: operands, then compares, in the data;
    /// the old values come back at the start of the data.
    pub const ATOMIC: u8 = 3;
    /// Remote CQ data for endpoint `ep_index` (after the operation
    /// landed): `data`, `len` bytes, `key` the registration it landed in,
    /// `aop` its [`cq_kind`]. Not answered: the owner frees the slot.
    pub const CQ_DATA: u8 = 4;
}

/// The request part of a mailbox slot (written by a peer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MboxReq {
    /// [`mbox_op`].
    pub op: u8,
    /// Datatype of an atomic (fi_datatype).
    pub dtype: u8,
    /// Atomic op (fi_op).
    pub aop: u8,
    /// Set: the atomic returns old values.
    pub fetch: u8,
    /// Target endpoint (CQ data).
    pub ep_index: u32,
    /// Key.
    pub key: u64,
    /// Offset in the registration; for CQ_DATA, the initiator's stamp
    /// (increasing over its requests: the owner queues the entries of one
    /// scan in stamp order).
    pub off: u64,
    /// Bytes of data (write, read) or of one operand array (atomic).
    pub len: u64,
    /// CQ data; for an atomic, 0 on the segment that ends the operation
    /// in its registration (the one the remote-event counters count), 1
    /// on the others (0, the default, counts).
    pub data: u64,
    /// Status written by the owner: 0 or a positive errno.
    pub status: u32,
    /// Elements of an atomic; for a write or read, 1 on the piece that
    /// ends the operation in its registration (the one the remote-event
    /// counters count), else 0.
    pub count: u32,
}

/// One mailbox slot: its word, the request, then its data.
#[repr(C, align(64))]
pub struct MboxSlot {
    /// A [`SlotWord`]: state, generation and claimer. Claimed (FREE to
    /// CLAIMED) by a CAS with acquire; REQ is published with release by
    /// the claimer, DONE by the owner; freed with release by the claimer,
    /// by the owner (CQ data), or by a CAS of whoever frees a dead
    /// claimer's slot.
    pub word: AtomicU64,
    /// The request.
    pub req: MboxReq,
    /// Payload.
    pub data: [u8; MBOX_DATA],
}

/// Why a mailbox request was refused by its decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MboxError {
    /// Unknown operation.
    Op,
    /// Length over the slot's data.
    Len,
    /// Atomic with a bad count.
    Count,
}

impl MboxReq {
    /// Checks a request read from shared memory: the operation is known,
    /// and whatever it moves fits the slot's data (for an atomic: `len` is
    /// `count` elements of `elem` bytes, and the operands, compares and
    /// results fit). `elem` gives an atomic's element size, or None for a
    /// datatype the owner does not know.
    pub fn decode(raw: &MboxReq, elem: impl Fn(u8) -> Option<usize>) -> Result<MboxReq, MboxError> {
        let r = *raw;
        match r.op {
            mbox_op::WRITE | mbox_op::READ => {
                if r.len > MBOX_DATA as u64 {
                    return Err(MboxError::Len);
                }
            }
            mbox_op::ATOMIC => {
                let e = elem(r.dtype).ok_or(MboxError::Op)? as u64;
                if r.count == 0 || r.len != e * r.count as u64 || r.len * 2 > MBOX_DATA as u64 {
                    return Err(MboxError::Count);
                }
            }
            mbox_op::CQ_DATA => {}
            _ => return Err(MboxError::Op),
        }
        Ok(r)
    }
}

/// Offset of the registration table.
pub const MR_OFFSET: usize = PAGE;
/// Offset of the lock table.
pub const fn locks_offset(n_mr: u32) -> usize {
    MR_OFFSET + n_mr as usize * core::mem::size_of::<MrEntry>()
}
/// Offset of the mailbox.
pub const fn mbox_offset(n_mr: u32) -> usize {
    locks_offset(n_mr) + N_LOCKS * core::mem::size_of::<AtomicLock>()
}
/// Offset of the initiator records.
pub const fn ini_offset(n_mr: u32, n_mbox: u32) -> usize {
    mbox_offset(n_mr) + n_mbox as usize * core::mem::size_of::<MboxSlot>()
}
/// Offset of the heap (page aligned).
pub const fn heap_offset(n_mr: u32, n_mbox: u32) -> usize {
    let end = ini_offset(n_mr, n_mbox) + N_INI * core::mem::size_of::<IniRecord>();
    end.div_ceil(PAGE) * PAGE
}

// The sizes hold for the real atomics; loom's model atomics are larger
// (as for the assertions of lib.rs).
#[cfg(not(loom))]
const _: () = {
    assert!(core::mem::size_of::<RmaHeader>() == PAGE);
    assert!(core::mem::size_of::<MrEntry>() == 128);
    assert!(core::mem::size_of::<MboxReq>() == 48);
    assert!(core::mem::size_of::<AtomicLock>() == 64);
    assert!(core::mem::size_of::<IniRecord>() == 64);
    assert!(core::mem::size_of::<MboxSlot>().is_multiple_of(64));
};

#[cfg(test)]
mod tests {
    use super::*;

    fn elem(d: u8) -> Option<usize> {
        [1, 1, 2, 2, 4, 4, 8, 8, 4, 8, 8, 16].get(d as usize).copied()
    }

    #[test]
    fn slot_words_round_trip() {
        let w = SlotWord::new(mbox_state::DONE, 0x3fff_ffff, PID_UNKNOWN);
        assert_eq!((w.state(), w.generation(), w.claimer()), (mbox_state::DONE, 0x3fff_ffff, PID_UNKNOWN));
        let c = w.freed().claimed_by(42);
        assert_eq!((c.state(), c.generation(), c.claimer()), (mbox_state::CLAIMED, 0, 42));
        assert_eq!(c.with_state(mbox_state::REQ).claimer(), 42);
        assert_ne!(
            SlotWord::new(mbox_state::FREE, 0, 0).claimed_by(7),
            SlotWord::new(mbox_state::FREE, 1, 0).claimed_by(7)
        );
    }

    #[test]
    fn decode_takes_good_requests() {
        let w = MboxReq { op: mbox_op::WRITE, len: MBOX_DATA as u64, ..Default::default() };
        assert_eq!(MboxReq::decode(&w, elem), Ok(w));
        let a = MboxReq { op: mbox_op::ATOMIC, dtype: 7, count: 3, len: 24, ..Default::default() };
        assert_eq!(MboxReq::decode(&a, elem), Ok(a));
    }

    /// Any bytes: the decoder never panics, and what it accepts fits.
    #[test]
    fn fuzz_mbox_req() {
        let mut s = 0x1234_5678_u64;
        let mut next = || {
            s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        for _ in 0..200_000 {
            let edge = [0, 1, 8, 16, MBOX_DATA as u64 / 2, MBOX_DATA as u64, MBOX_DATA as u64 + 1, u64::MAX];
            let r = MboxReq {
                op: (next() % 6) as u8,
                dtype: (next() % 16) as u8,
                aop: next() as u8,
                fetch: next() as u8,
                ep_index: next() as u32,
                key: next(),
                off: next(),
                len: if next() % 2 == 0 { edge[(next() % 8) as usize] } else { next() % 40000 },
                data: next(),
                status: next() as u32,
                count: if next() % 2 == 0 { (next() % 3000) as u32 } else { next() as u32 },
            };
            if let Ok(d) = MboxReq::decode(&r, elem) {
                match d.op {
                    mbox_op::WRITE | mbox_op::READ => assert!(d.len <= MBOX_DATA as u64),
                    mbox_op::ATOMIC => {
                        assert!(d.count > 0 && d.len * 2 <= MBOX_DATA as u64);
                        assert_eq!(d.len, elem(d.dtype).unwrap() as u64 * d.count as u64);
                    }
                    mbox_op::CQ_DATA => {}
                    _ => panic!("accepted op {}", d.op),
                }
            }
        }
    }
}
