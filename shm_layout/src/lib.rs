//! Every type that shmfab keeps in shared memory.
//!
//! Everything here is `#[repr(C)]`, holds no pointer (only offsets relative
//! to the start of the region, which readers check against the region's size
//! before use), and has its size and alignment asserted at compile time. A
//! region records [`LAYOUT_VERSION`] and [`LAYOUT_HASH`]; a process built
//! with another layout refuses to attach to it.
//!
//! One region per domain:
//!
//! ```text
//! RegionHeader (one page: identity, geometry, doorbell)
//! Counter[n_counters]
//! EpSection[n_eps], each:
//!     EpHeader | SlotEntry[n_slots] | RingCtl[n_slots] | cells[n_slots][ring_cells]
//!     | OvfCtl | OvfCell[ovf_cells] | PoolCtl | pool next[] | chunks[pool_chunks]
//! ```
//!
//! ```
//! use shm_layout::{EpGeometry, RegionHeader};
//! let g = EpGeometry::DEFAULT;
//! assert!(g.validate().is_ok());
//! assert_eq!(g.section_size() % 4096, 0);
//! assert_eq!(core::mem::size_of::<RegionHeader>(), 4096);
//! ```
#![deny(missing_docs)]
#![cfg_attr(not(loom), no_std)]

pub mod rma;
pub mod sync;
pub mod wire;

pub use wire::{BounceHdr, Chunk, Control, CtrlKind, CtsWrite, IovRange, Rts, WireError};

use sync::{AtomicU32, AtomicU64};

/// Size of a cache line, the unit of every ring cell.
pub const CACHE_LINE: usize = 64;
/// Page size the sections are aligned to.
pub const PAGE: usize = 4096;
/// `b"SHMFAB\0\x01"` read as a little-endian u64: the first word of a region.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SHMFAB\0\x01");
/// Layout version: bump when any type in this crate changes meaning.
pub const LAYOUT_VERSION: u32 = 4;
/// Most ring slots an endpoint can have (slot claims are a 64-bit mask).
pub const MAX_SLOTS: u32 = 64;
/// Most iov segments in one operation.
pub const MAX_IOV: usize = 4;

/// Region states (`RegionHeader::state`).
pub mod state {
    /// Being initialised by its owner.
    pub const INIT: u32 = 0;
    /// Open for peers.
    pub const READY: u32 = 1;
    /// Its owner is closing it.
    pub const CLOSING: u32 = 2;
}

/// A cache line holding one atomic word; keeps hot indices apart.
#[repr(C, align(64))]
pub struct PaddedU64 {
    /// The word.
    pub v: AtomicU64,
}

/// The identity of an endpoint: its domain region plus the endpoint's index.
/// This is what `getname` returns and `av_insert` takes (24 bytes).
///
/// A region is reached through its owner: an anonymous region (the
/// default: no name in the file system, so nothing is left behind when its
/// processes die) is opened as `/proc/<pid>/fd/<fd>`; a named one
/// (`fd == Address::NAMED`) as `shmfab.<uid>.<job>.<token>` in the shared
/// memory directory. Either way the region's header must carry `job` and
/// `token`, which tells a reused pid or fd from the owner.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Address {
    /// Pid of the region's owner (as its own PID namespace sees it).
    pub pid: u32,
    /// Hash of the job id.
    pub job: u32,
    /// Random part of the region's identity (never 0 in a real address).
    pub token: u32,
    /// The owner's descriptor of an anonymous region, or [`Address::NAMED`].
    pub fd: u32,
    /// Endpoint index inside the region.
    pub ep_index: u32,
    /// Generation of the endpoint section (a reopened section is a new
    /// address).
    pub generation: u32,
}

impl Address {
    /// Size of an address in bytes.
    pub const SIZE: usize = 24;

    /// `fd` of an address whose region has a name in the shared memory
    /// directory.
    pub const NAMED: u32 = u32::MAX;

    /// Serialises to bytes (little endian).
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        let words = [self.pid, self.job, self.token, self.fd, self.ep_index, self.generation];
        for (i, w) in words.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// Parses bytes written by [`Address::to_bytes`].
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Address {
            pid: u32_at(0),
            job: u32_at(4),
            token: u32_at(8),
            fd: u32_at(12),
            ep_index: u32_at(16),
            generation: u32_at(20),
        })
    }

    /// Whether this can be a real address: an owner pid and a token (an
    /// all-zero or half-written announcement is not).
    pub fn is_plausible(&self) -> bool {
        self.pid != 0 && self.token != 0
    }

    /// The region part (pid, fd, job, token) as one key: equal for every
    /// endpoint of one region.
    pub fn region_key(&self) -> (u32, u32, u32, u32) {
        (self.pid, self.fd, self.job, self.token)
    }

    /// 64 bits that differ between regions (owner pid and token).
    pub fn region_bits(&self) -> u64 {
        ((self.pid as u64) << 32) | self.token as u64
    }
}

/// The doorbell: one futex word per receiving domain and the count of its
/// sleepers. A signaller publishes, fences, and calls FUTEX_WAKE only when
/// `sleepers` is non-zero.
#[repr(C, align(64))]
pub struct Doorbell {
    /// Futex word; bumped by a signaller that saw a sleeper.
    pub futex: AtomicU32,
    /// Threads of the owner that are (about to be) asleep on `futex`.
    pub sleepers: AtomicU32,
    /// Of those, the ones that also wait for what the owner's own threads
    /// make (application waits and the fd bridge; not the progress
    /// thread): a completion one thread queues wakes them.
    pub watchers: AtomicU32,
}

/// Sizes of the parts of an endpoint section. Fixed per region, chosen by the
/// owner at creation and read by peers from the header.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpGeometry {
    /// SPSC ring slots (1 ..= MAX_SLOTS).
    pub n_slots: u32,
    /// Cells per ring (power of two, >= 128).
    pub ring_cells: u32,
    /// Cells of the MPSC overflow queue (power of two, >= 2).
    pub ovf_cells: u32,
    /// Chunks in the bounce-buffer pool (1 ..= 65536).
    pub pool_chunks: u32,
    /// Bytes per pool chunk (multiple of 4096).
    pub chunk_size: u32,
    /// Zero.
    pub reserved: u32,
}

const fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl EpGeometry {
    /// Default geometry: 16 rings of 256 cells (16 KiB each), a 64-entry
    /// overflow queue, and 32 chunks of 32 KiB in the pool.
    pub const DEFAULT: EpGeometry =
        EpGeometry { n_slots: 16, ring_cells: 256, ovf_cells: 64, pool_chunks: 32, chunk_size: 32 * 1024, reserved: 0 };

    /// Checks every bound; returns what is wrong.
    pub const fn validate(&self) -> Result<(), &'static str> {
        if self.n_slots == 0 || self.n_slots > MAX_SLOTS {
            return Err("n_slots must be 1..=64");
        }
        if !self.ring_cells.is_power_of_two() || self.ring_cells < 128 || self.ring_cells > 1 << 20 {
            return Err("ring_cells must be a power of two in 128..=2^20");
        }
        if !self.ovf_cells.is_power_of_two() || self.ovf_cells < 2 || self.ovf_cells > 1 << 16 {
            return Err("ovf_cells must be a power of two in 2..=65536");
        }
        if self.pool_chunks == 0 || self.pool_chunks > 65536 {
            return Err("pool_chunks must be 1..=65536");
        }
        if self.chunk_size < 4096 || !self.chunk_size.is_multiple_of(4096) || self.chunk_size > 1 << 24 {
            return Err("chunk_size must be a multiple of 4096 up to 16 MiB");
        }
        Ok(())
    }

    /// Offset of the slot table in a section.
    pub const fn slots_offset(&self) -> usize {
        core::mem::size_of::<EpHeader>()
    }
    /// Offset of the ring control blocks.
    pub const fn ringctl_offset(&self) -> usize {
        align_up(self.slots_offset() + self.n_slots as usize * core::mem::size_of::<SlotEntry>(), CACHE_LINE)
    }
    /// Offset of the ring cells (ring `i` starts at `i * ring_cells * 64`).
    pub const fn cells_offset(&self) -> usize {
        align_up(self.ringctl_offset() + self.n_slots as usize * core::mem::size_of::<RingCtl>(), PAGE)
    }
    /// Offset of the overflow queue's control block.
    pub const fn ovfctl_offset(&self) -> usize {
        self.cells_offset() + self.n_slots as usize * self.ring_cells as usize * CACHE_LINE
    }
    /// Offset of the overflow cells.
    pub const fn ovf_cells_offset(&self) -> usize {
        self.ovfctl_offset() + core::mem::size_of::<OvfCtl>()
    }
    /// Offset of the pool's control block.
    pub const fn poolctl_offset(&self) -> usize {
        self.ovf_cells_offset() + self.ovf_cells as usize * core::mem::size_of::<OvfCell>()
    }
    /// Offset of the pool's next-links (`u32` per chunk).
    pub const fn pool_next_offset(&self) -> usize {
        self.poolctl_offset() + core::mem::size_of::<PoolCtl>()
    }
    /// Offset of the first pool chunk.
    pub const fn chunks_offset(&self) -> usize {
        align_up(self.pool_next_offset() + self.pool_chunks as usize * 4, PAGE)
    }
    /// Bytes of one endpoint section (page aligned).
    pub const fn section_size(&self) -> usize {
        align_up(self.chunks_offset() + self.pool_chunks as usize * self.chunk_size as usize, PAGE)
    }
}

/// Offset of the counter table in a region.
pub const COUNTERS_OFFSET: usize = core::mem::size_of::<RegionHeader>();

/// Bytes of a region with `n_eps` endpoint sections and `n_counters`.
pub const fn region_size(g: &EpGeometry, n_eps: u32, n_counters: u32) -> usize {
    eps_offset(n_counters) + n_eps as usize * g.section_size()
}

/// Offset of the first endpoint section.
pub const fn eps_offset(n_counters: u32) -> usize {
    align_up(COUNTERS_OFFSET + n_counters as usize * core::mem::size_of::<Counter>(), PAGE)
}

/// The first page of a region.
#[repr(C, align(4096))]
pub struct RegionHeader {
    // Stable prefix: identical in every layout version, so that any version
    // can tell whose region this is and whether its owner lives.
    /// [`MAGIC`]; stored last at creation (release), so a reader that sees
    /// it sees the whole header.
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`] of the creator.
    pub layout_version: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's pid.
    pub owner_pid: u32,
    /// One of [`state`].
    pub state: AtomicU32,
    /// Owner's start time in clock ticks since boot (/proc/PID/stat field
    /// 22): tells a reused pid from the owner.
    pub owner_start_time: u64,
    /// [`LAYOUT_HASH`] of the creator.
    pub layout_hash: u64,
    // Version 1.
    /// Bytes of the whole region.
    pub total_size: u64,
    /// Hash of the job id.
    pub job: u32,
    /// Endpoint sections.
    pub n_eps: u32,
    /// Counters in the counter table.
    pub n_counters: u32,
    /// The region's token (as in its addresses and name): an opener that
    /// found the region through a pid and descriptor checks it.
    pub token: u32,
    /// Geometry of every endpoint section.
    pub geometry: EpGeometry,
    /// The domain's doorbell.
    pub doorbell: Doorbell,
    /// The owner's PID namespace (inode of /proc/self/ns/pid; 0 unknown):
    /// a peer in another one must not take `owner_pid` for a process of
    /// its own (single copy would name the wrong process).
    pub pid_ns: u64,
}

/// A counter's values, each on its own line (remote updates, local reads).
#[repr(C, align(64))]
pub struct Counter {
    /// Success value.
    pub value: PaddedU64,
    /// Error value.
    pub err: PaddedU64,
}

/// Endpoint states (`EpHeader::state`).
pub mod ep_state {
    /// Not open.
    pub const CLOSED: u32 = 0;
    /// Open and receiving.
    pub const OPEN: u32 = 1;
}

/// Head of an endpoint section.
#[repr(C, align(64))]
pub struct EpHeader {
    /// One of [`ep_state`].
    pub state: AtomicU32,
    /// Bumped each time the section is (re)opened; a peer's slot claim is for
    /// one generation.
    pub generation: AtomicU32,
    /// Bit `i` set once slot `i`'s claim is announced (release): a hint for
    /// the owner, which takes a ring only for an announced owner word of
    /// its generation and drops the bits of other slots.
    pub claimed: AtomicU64,
    /// Non-zero once any sender used the overflow queue.
    pub ovf_used: AtomicU32,
    /// Sends queued or in flight (published by the owner now and then, for
    /// `shmfab inspect`; so are the four words below).
    pub tx_queued: AtomicU32,
    /// Receives posted.
    pub rx_posted: AtomicU32,
    /// Unexpected messages held.
    pub unexpected: AtomicU32,
    /// Receives whose data is still arriving.
    pub rx_active: AtomicU32,
    /// Zero.
    pub reserved: u32,
    /// Progress passes so far: a heartbeat of the owner.
    pub passes: AtomicU64,
}

/// One entry of the ring slot table: which sender owns ring `i`.
#[repr(C, align(64))]
pub struct SlotEntry {
    /// 0 when free; otherwise the claimant's token: without its announced
    /// bit (CAS from 0), then with it once `addr` is written (CAS).
    pub owner: AtomicU64,
    /// The claimant's address, written after the claim and before the
    /// claim is announced.
    pub addr: Address,
}

/// Control words of one SPSC ring, on separate cache lines.
#[repr(C, align(64))]
pub struct RingCtl {
    /// Consumer position (cells consumed, monotonic). Written by the
    /// consumer (release, batched), read by the producer when its cached copy
    /// says the ring looks full.
    pub head: PaddedU64,
    /// Producer position (cells published, monotonic). Written by the
    /// producer; read only by observers (`shmfab inspect`).
    pub tail: PaddedU64,
}

/// Message header, shared by ring cells and overflow cells (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgHdr {
    /// One of [`op`].
    pub op: u8,
    /// Bits of [`hdr_flags`].
    pub flags: u8,
    /// Cells the message occupies (>= 1).
    pub ncells: u16,
    /// Payload length (meaning depends on `op`).
    pub len: u32,
    /// Tag, or the message id of control messages.
    pub tag: u64,
    /// Remote CQ data, or an offset.
    pub data: u64,
}

impl MsgHdr {
    /// The header as the three 8-byte words it occupies in memory, with
    /// `ncells` replaced: writers store these words (narrow field stores
    /// followed by a wide copy stall store forwarding on the send path).
    #[inline]
    pub fn words(&self, ncells: u16) -> [u64; 3] {
        let n = ncells.to_ne_bytes();
        let l = self.len.to_ne_bytes();
        [u64::from_ne_bytes([self.op, self.flags, n[0], n[1], l[0], l[1], l[2], l[3]]), self.tag, self.data]
    }
}

/// Message kinds. Every kind but `EAGER` is a format of [`wire`], whose
/// type says what travels in the header and what in the payload.
pub mod op {
    /// Whole payload inline in the cells (the user's header and bytes).
    pub const EAGER: u8 = 1;
    /// Start of a message sent through pool chunks ([`BounceHdr`](crate::wire::BounceHdr)).
    pub const BOUNCE_HDR: u8 = 2;
    /// One pool chunk of a bounce message ([`Chunk`](crate::wire::Chunk)).
    pub const CHUNK: u8 = 3;
    /// Request to send, rendezvous ([`Rts`](crate::wire::Rts)).
    pub const RTS: u8 = 4;
    /// Receiver to sender: single copy refused, send through the pool
    /// ([`Control`](crate::wire::Control)).
    pub const CTS_BOUNCE: u8 = 5;
    /// Receiver to sender: done with the message, with a status
    /// ([`Control`](crate::wire::Control)).
    pub const FIN: u8 = 6;
    /// Receiver to sender, split single copy: "write bytes from an offset
    /// onwards of the message into these ranges of mine while I read the
    /// part before" ([`CtsWrite`](crate::wire::CtsWrite)).
    pub const CTS_WRITE: u8 = 7;
    /// Sender to receiver: the write asked by CTS_WRITE is done, with a
    /// status ([`Control`](crate::wire::Control)).
    pub const WDONE: u8 = 8;
    /// An inline message like `EAGER`, piped: published before its
    /// payload is written, so that the receiver copies while the sender
    /// writes. Its payload starts at the second cell; the first 8 bytes of
    /// the first cell's payload area ([`PIPE_PROGRESS`](crate::PIPE_PROGRESS))
    /// are the count of payload bytes written so far, stored with release
    /// after each piece and read with acquire. The message is whole when
    /// it equals `len`. Only in rings (never in the overflow queue).
    pub const PIPED: u8 = 9;
}

/// Bits of an RTS's flags word.
pub mod rts_flags {
    /// The receiver may read the data by single copy (process_vm_readv).
    pub const CMA: u32 = 1;
    /// The sender waits for the receiver's FIN also when the data comes
    /// through the pool (FI_DELIVERY_COMPLETE). Without it a send whose
    /// data the receiver asked for through the pool (CTS_BOUNCE) completes
    /// at its last chunk and no FIN is sent; a single copy always ends
    /// with a FIN (the receiver reads the sender's buffer).
    pub const FIN: u32 = 2;
}

/// Bits of `MsgHdr::flags`.
pub mod hdr_flags {
    /// Tagged message.
    pub const TAGGED: u8 = 1;
    /// `data` holds remote CQ data.
    pub const REMOTE_CQ_DATA: u8 = 2;
    /// Sender asked for a solicited event.
    pub const SOLICITED: u8 = 4;
    /// Part of a stream: sent while another send to the same peer was
    /// under way, in a size class where the receiver picks single copy or
    /// the pool (`shmfab::proto::StreamPick`). Only steers that pick
    /// (a false one costs the sender speed, nothing else).
    pub const STREAM: u8 = 8;
}

/// Offset in a piped message's first cell of its progress word (an
/// `AtomicU64`: see [`op::PIPED`]): the start of the payload area.
pub const PIPE_PROGRESS: usize = core::mem::offset_of!(Cell, payload);

/// First cell of a ring message. Continuation cells are 64 bytes of payload.
#[repr(C, align(64))]
pub struct Cell {
    /// `position + 1` once the message starting here is published (release
    /// by the producer, acquire by the consumer). Any other value: not yet.
    pub seq: AtomicU64,
    /// Header.
    pub hdr: MsgHdr,
    /// First bytes of payload.
    pub payload: [u8; CELL_PAYLOAD],
}

/// Payload bytes in a message's first ring cell.
pub const CELL_PAYLOAD: usize = 32;

/// Control block of the MPSC overflow queue (bounded, Vyukov style).
#[repr(C, align(64))]
pub struct OvfCtl {
    /// Next position to enqueue (producers CAS it).
    pub enqueue: PaddedU64,
    /// Next position to dequeue (the owner only).
    pub dequeue: PaddedU64,
}

/// Payload bytes of an overflow cell.
pub const OVF_PAYLOAD: usize = 72;

/// One overflow queue entry (two cache lines).
#[repr(C, align(64))]
pub struct OvfCell {
    /// Vyukov sequence: `pos` when free for the producer of `pos`, `pos + 1`
    /// when full; the consumer stores `pos + ovf_cells` after reading.
    pub seq: AtomicU64,
    /// Header.
    pub hdr: MsgHdr,
    /// Sender's address (overflow cells have no slot to say it).
    pub src: Address,
    /// Payload.
    pub payload: [u8; OVF_PAYLOAD],
}

/// The bounce-buffer pool's free list: a Treiber stack of chunk indices with
/// an ABA tag. `head` = `tag << 32 | (index + 1)`, 0 in the low half = empty.
#[repr(C, align(64))]
pub struct PoolCtl {
    /// Stack head.
    pub head: AtomicU64,
    /// Chunks currently taken (observability only).
    pub in_use: AtomicU32,
    /// Zero.
    pub reserved: u32,
}

/// Header of a job's boot region (`shmfab.<uid>.<jobhash>.boot`), where
/// the ranks of a job meet: each publishes its addresses, then reads the
/// others'. Its first 40 bytes are the same stable prefix as
/// [`RegionHeader`]'s (magic, version, uid, creator pid, state, start time,
/// hash), so region scans treat it alike.
#[repr(C, align(4096))]
pub struct BootHeader {
    /// [`MAGIC`], stored last at creation (release).
    pub magic: AtomicU64,
    /// [`LAYOUT_VERSION`].
    pub layout_version: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Creator's pid.
    pub owner_pid: u32,
    /// One of [`state`].
    pub state: AtomicU32,
    /// Creator's start time (clock ticks since boot).
    pub owner_start_time: u64,
    /// [`LAYOUT_HASH`].
    pub layout_hash: u64,
    /// Ranks in the job.
    pub size: u32,
    /// Ranks that published their entry.
    pub arrived: AtomicU32,
    /// Ranks that have read every entry.
    pub departed: AtomicU32,
    /// Zero.
    pub reserved: u32,
    /// [`BOOT_MARK`]: tells a boot region from a domain region (whose
    /// `n_counters`, at 4096 at most, lies here) when it has no name.
    pub mark: u32,
    /// Hash of the job id.
    pub job: u32,
}

/// [`BootHeader::mark`]: "BOOT".
pub const BOOT_MARK: u32 = u32::from_le_bytes(*b"BOOT");

/// One rank's entry in a boot region.
#[repr(C, align(64))]
pub struct BootEntry {
    /// 1 once the entry is written (release).
    pub state: AtomicU32,
    /// The rank's pid.
    pub pid: u32,
    /// The rank's start time.
    pub start_time: u64,
    /// Address of the rank's application endpoint.
    pub addr: Address,
    /// Address of the rank's control endpoint (barriers).
    pub ctl: Address,
}

// Compile-time layout checks.
#[cfg(not(loom))]
const _: () = {
    use core::mem::{align_of, size_of};
    assert!(size_of::<Address>() == Address::SIZE);
    assert!(size_of::<PaddedU64>() == 64 && align_of::<PaddedU64>() == 64);
    assert!(size_of::<Doorbell>() == 64);
    assert!(size_of::<RegionHeader>() == PAGE && align_of::<RegionHeader>() == PAGE);
    assert!(size_of::<Counter>() == 128);
    assert!(size_of::<EpHeader>() == 64);
    assert!(size_of::<SlotEntry>() == 64);
    assert!(size_of::<RingCtl>() == 128);
    assert!(size_of::<MsgHdr>() == 24);
    assert!(size_of::<Cell>() == CACHE_LINE);
    assert!(size_of::<OvfCtl>() == 128);
    assert!(size_of::<OvfCell>() == 2 * CACHE_LINE);
    assert!(size_of::<PoolCtl>() == 64);
    assert!(core::mem::offset_of!(Cell, hdr) == 8);
    assert!(core::mem::offset_of!(Cell, payload) == 32);
    assert!(core::mem::offset_of!(RegionHeader, magic) == 0);
    assert!(core::mem::offset_of!(RegionHeader, layout_version) == 8);
    assert!(core::mem::offset_of!(RegionHeader, uid) == 12);
    assert!(core::mem::offset_of!(RegionHeader, owner_pid) == 16);
    assert!(core::mem::offset_of!(RegionHeader, owner_start_time) == 24);
    assert!(core::mem::offset_of!(RegionHeader, layout_hash) == 32);
    assert!(EpGeometry::DEFAULT.validate().is_ok());
    assert!(size_of::<BootHeader>() == PAGE);
    assert!(size_of::<BootEntry>() == 64);
    assert!(core::mem::offset_of!(BootHeader, owner_pid) == 16);
    assert!(core::mem::offset_of!(BootHeader, owner_start_time) == 24);
    assert!(core::mem::offset_of!(BootHeader, mark) == core::mem::offset_of!(RegionHeader, n_counters));
    assert!(core::mem::offset_of!(BootHeader, job) == core::mem::offset_of!(RegionHeader, token));
};

const fn fnv(mut h: u64, x: u64) -> u64 {
    let mut i = 0;
    while i < 8 {
        h ^= (x >> (i * 8)) & 0xff;
        h = h.wrapping_mul(0x100_0000_01b3);
        i += 1;
    }
    h
}

/// Hash of the sizes, alignments and key offsets of every shared type and
/// of the wire formats ([`wire`]: payload offsets, kind numbers): two
/// builds agree on it only if they agree on the layout.
pub const LAYOUT_HASH: u64 = {
    use core::mem::{align_of, offset_of, size_of};
    let parts: [u64; 27] = [
        LAYOUT_VERSION as u64,
        size_of::<RegionHeader>() as u64,
        offset_of!(RegionHeader, total_size) as u64,
        offset_of!(RegionHeader, geometry) as u64,
        offset_of!(RegionHeader, doorbell) as u64,
        size_of::<EpGeometry>() as u64,
        size_of::<Counter>() as u64,
        size_of::<EpHeader>() as u64,
        offset_of!(EpHeader, claimed) as u64,
        offset_of!(EpHeader, passes) as u64,
        size_of::<SlotEntry>() as u64,
        offset_of!(SlotEntry, addr) as u64,
        size_of::<RingCtl>() as u64,
        size_of::<MsgHdr>() as u64,
        offset_of!(MsgHdr, tag) as u64,
        size_of::<Cell>() as u64,
        offset_of!(Cell, payload) as u64,
        size_of::<OvfCell>() as u64,
        offset_of!(OvfCell, src) as u64,
        offset_of!(OvfCell, payload) as u64,
        size_of::<PoolCtl>() as u64,
        size_of::<Address>() as u64,
        align_of::<Cell>() as u64,
        MAX_SLOTS as u64,
        MAX_IOV as u64,
        size_of::<BootEntry>() as u64,
        offset_of!(BootEntry, ctl) as u64,
    ];
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < parts.len() {
        h = fnv(h, parts[i]);
        i += 1;
    }
    // The control and payload formats ([`wire`]).
    let mut i = 0;
    while i < wire::HASH_PARTS.len() {
        h = fnv(h, wire::HASH_PARTS[i]);
        i += 1;
    }
    h
};

#[cfg(test)]
mod hdr_tests {
    use super::*;

    #[test]
    fn header_words_are_its_memory() {
        let h = MsgHdr { op: 3, flags: 0x81, ncells: 9, len: 0x0102_0304, tag: 7, data: u64::MAX };
        let w = h.words(9);
        // SAFETY: MsgHdr is 24 bytes of plain data.
        let mem: [u64; 3] = unsafe { core::mem::transmute(h) };
        assert_eq!(w, mem);
        assert_ne!(h.words(10), mem);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_round_trips() {
        let a = Address { pid: 1000, job: 0xdead_beef, token: 0x0123_4567, fd: 9, ep_index: 3, generation: 2 };
        assert_eq!(Address::from_bytes(&a.to_bytes()), Some(a));
        assert_eq!(Address::from_bytes(&[0u8; 5]), None);
    }

    #[test]
    fn geometry_offsets_are_ordered_and_aligned() {
        let g = EpGeometry::DEFAULT;
        assert!(g.slots_offset() < g.ringctl_offset());
        assert!(g.ringctl_offset() < g.cells_offset());
        assert_eq!(g.cells_offset() % PAGE, 0);
        assert!(g.ovfctl_offset() < g.ovf_cells_offset());
        assert!(g.poolctl_offset() < g.pool_next_offset());
        assert_eq!(g.chunks_offset() % PAGE, 0);
        assert!(g.section_size() >= g.chunks_offset() + 32 * 32 * 1024);
        assert_eq!(region_size(&g, 2, 8) % PAGE, 0);
    }

    #[test]
    fn geometry_rejects_bad_values() {
        let mut g = EpGeometry::DEFAULT;
        g.ring_cells = 100;
        assert!(g.validate().is_err());
        let mut g = EpGeometry::DEFAULT;
        g.n_slots = 65;
        assert!(g.validate().is_err());
        let mut g = EpGeometry::DEFAULT;
        g.chunk_size = 1000;
        assert!(g.validate().is_err());
        let mut g = EpGeometry::DEFAULT;
        g.pool_chunks = 0;
        assert!(g.validate().is_err());
    }
}
