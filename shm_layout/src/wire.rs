//! The control and payload formats of the multi-part protocols, each a
//! `#[repr(C)]` value with exactly one encoder and one decoder.
//!
//! A message is a [`MsgHdr`] plus payload bytes in ring or overflow cells.
//! The inline message ([`op::EAGER`]) carries the user's bytes and is not
//! described here. Every other kind is a format of this module:
//!
//! | kind | type | in the header | payload |
//! |------|------|---------------|---------|
//! | [`op::BOUNCE_HDR`] | [`BounceHdr`] | the user's tag, flags, data | msg id, total |
//! | [`op::CHUNK`] | [`Chunk`] | msg id, offset, length | pool chunk index |
//! | [`op::RTS`] | [`Rts`] | the user's tag, flags, data | msg id, total, count, flags, ranges |
//! | [`op::CTS_WRITE`] | [`CtsWrite`] | msg id, offset | count, reserved, ranges |
//! | [`op::CTS_BOUNCE`], [`op::FIN`], [`op::WDONE`] | [`Control`] | msg id, status | none |
//!
//! Payload bytes are the little-endian image of the type's `#[repr(C)]`
//! fields, in order, from the field the table's payload column starts with:
//! the offsets the codecs use are the fields' offsets (`offset_of!`), which
//! [`LAYOUT_HASH`](crate::LAYOUT_HASH) covers.
//!
//! Everything a peer writes is untrusted. A decoder takes the bytes as they
//! are (any length, any content) and returns either a value that satisfies
//! the invariant its type documents, or a [`WireError`]; it never panics
//! and never reads past the slice it is given. Checks that need the
//! receiver's state (is this message id already in progress, does this
//! offset follow the last chunk) stay with the caller.
//!
//! ```
//! use shm_layout::wire::{IovRange, Rts, WireError};
//! let rts = Rts::new(7, 100, 0, [IovRange { addr: 0x1000, len: 60 }, IovRange { addr: 0x2000, len: 40 }])?;
//! let mut buf = [0u8; Rts::MAX_WIRE];
//! let n = rts.encode(&mut buf)?;
//! assert_eq!(n, Rts::HEAD + 2 * IovRange::SIZE);
//! assert_eq!(Rts::decode(&buf[..n], 1 << 40), Ok(rts));
//! // A peer's lengths that do not add up are refused.
//! buf[Rts::HEAD + 8] = 61;
//! assert_eq!(Rts::decode(&buf[..n], 1 << 40), Err(WireError::LengthMismatch));
//! # Ok::<(), WireError>(())
//! ```

use crate::{op, MsgHdr, MAX_IOV};
use core::mem::{offset_of, size_of};

/// What is wrong with a message (decoders) or with a value or buffer
/// (encoders).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The payload has `got` bytes; the format (or its count field) needs
    /// `need`.
    Short {
        /// Bytes needed.
        need: usize,
        /// Bytes there.
        got: usize,
    },
    /// The encoder's output buffer has `have` bytes; the value needs `need`.
    NoRoom {
        /// Bytes needed.
        need: usize,
        /// Bytes in the buffer.
        have: usize,
    },
    /// The header's `op` is not a kind this decoder reads.
    WrongOp(u8),
    /// Message id zero (senders number messages from 1).
    ZeroMsgId,
    /// A bounce message of no bytes (those go inline).
    Empty,
    /// The message is longer than the receiver's maximum.
    TooLarge {
        /// Total the peer announced.
        total: u64,
        /// Largest the receiver takes.
        max: u64,
    },
    /// A range count out of its bounds (an RTS has 1..=[`MAX_IOV`], a
    /// CTS_WRITE 0..=[`MAX_IOV`]).
    BadCount(u32),
    /// The ranges' lengths do not add up to the announced total (or their
    /// sum overflows).
    LengthMismatch,
    /// Offset plus length overflows.
    Overflow,
    /// A chunk index outside the receiver's pool.
    ChunkIndex(u32),
    /// A chunk length of 0 or over the chunk size. `index` is a valid
    /// chunk of the receiver's pool, which the sender handed over with the
    /// message: the receiver must free it.
    ChunkLen {
        /// The (valid) chunk index.
        index: u32,
        /// The length the peer wrote.
        len: u32,
    },
}

impl WireError {
    /// A short description, without the values.
    pub const fn what(&self) -> &'static str {
        match self {
            WireError::Short { .. } => "message shorter than its format",
            WireError::NoRoom { .. } => "buffer too small for the message",
            WireError::WrongOp(_) => "wrong message kind",
            WireError::ZeroMsgId => "message id zero",
            WireError::Empty => "multi-part message of no bytes",
            WireError::TooLarge { .. } => "message over the size limit",
            WireError::BadCount(_) => "range count out of bounds",
            WireError::LengthMismatch => "range lengths do not add up to the total",
            WireError::Overflow => "offset plus length overflows",
            WireError::ChunkIndex(_) => "chunk index out of range",
            WireError::ChunkLen { .. } => "chunk length out of range",
        }
    }
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            WireError::Short { need, got } => write!(f, "{}: {got} bytes, {need} needed", self.what()),
            WireError::NoRoom { need, have } => write!(f, "{}: {have} bytes, {need} needed", self.what()),
            WireError::WrongOp(o) => write!(f, "{}: {o}", self.what()),
            WireError::TooLarge { total, max } => write!(f, "{}: {total} bytes, at most {max}", self.what()),
            WireError::BadCount(n) => write!(f, "{}: {n}", self.what()),
            WireError::ChunkIndex(i) => write!(f, "{}: {i}", self.what()),
            WireError::ChunkLen { index, len } => write!(f, "{}: {len} bytes in chunk {index}", self.what()),
            _ => f.write_str(self.what()),
        }
    }
}

/// Reads the little-endian `u64` at `at`; `Short` if it is not all there.
fn u64_at(b: &[u8], at: usize) -> Result<u64, WireError> {
    match b.get(at..at.saturating_add(8)).and_then(|s| <[u8; 8]>::try_from(s).ok()) {
        Some(a) => Ok(u64::from_le_bytes(a)),
        None => Err(WireError::Short { need: at.saturating_add(8), got: b.len() }),
    }
}

/// Reads the little-endian `u32` at `at`; `Short` if it is not all there.
#[inline]
fn u32_at(b: &[u8], at: usize) -> Result<u32, WireError> {
    match b.get(at..at.saturating_add(4)).and_then(|s| <[u8; 4]>::try_from(s).ok()) {
        Some(a) => Ok(u32::from_le_bytes(a)),
        None => Err(WireError::Short { need: at.saturating_add(4), got: b.len() }),
    }
}

/// `Short` unless `b` has at least `need` bytes.
fn need(b: &[u8], need: usize) -> Result<(), WireError> {
    if b.len() < need {
        return Err(WireError::Short { need, got: b.len() });
    }
    Ok(())
}

/// The first `need` bytes of `out`, or `NoRoom`.
#[inline]
fn room(out: &mut [u8], need: usize) -> Result<&mut [u8], WireError> {
    let have = out.len();
    out.get_mut(..need).ok_or(WireError::NoRoom { need, have })
}

/// Writes `v` at `at` of `out`, which the caller sized through [`room`].
#[inline]
fn put(out: &mut [u8], at: usize, v: &[u8]) {
    out[at..at + v.len()].copy_from_slice(v);
}

/// One range of a process's memory: `len` bytes from `addr`, in the
/// address space of the process that wrote it.
///
/// Written by the owner of the memory (the sender for an RTS, the receiver
/// for a CTS_WRITE). The peer reading it uses it only through
/// process_vm_readv / process_vm_writev on the writer's pid, where the
/// kernel checks the addresses; decoders check lengths only (their sum).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IovRange {
    /// Start address (untrusted; never dereferenced by the reader).
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

impl IovRange {
    /// Bytes of a range on the wire.
    pub const SIZE: usize = size_of::<IovRange>();

    /// Reads the range at byte `at` of `b`.
    fn read(b: &[u8], at: usize) -> Result<IovRange, WireError> {
        Ok(IovRange {
            addr: u64_at(b, at + offset_of!(IovRange, addr))?,
            len: u64_at(b, at + offset_of!(IovRange, len))?,
        })
    }

    /// Writes it at byte `at` of `out` (sized by the caller).
    fn write(&self, out: &mut [u8], at: usize) {
        put(out, at + offset_of!(IovRange, addr), &self.addr.to_le_bytes());
        put(out, at + offset_of!(IovRange, len), &self.len.to_le_bytes());
    }
}

/// Copies up to [`MAX_IOV`] ranges into an array: the count, or
/// `BadCount` when there are more.
fn collect_ranges(it: impl IntoIterator<Item = IovRange>) -> Result<(u32, [IovRange; MAX_IOV]), WireError> {
    let mut v = [IovRange::default(); MAX_IOV];
    let mut n = 0usize;
    for r in it {
        match v.get_mut(n) {
            Some(slot) => *slot = r,
            None => return Err(WireError::BadCount(n.saturating_add(1) as u32)),
        }
        n += 1;
    }
    Ok((n as u32, v))
}

/// Sums lengths with overflow checked.
fn sum_lens(v: &[IovRange]) -> Option<u64> {
    v.iter().try_fold(0u64, |a, r| a.checked_add(r.len))
}

/// Payload of [`op::BOUNCE_HDR`]: the start of a message sent through the
/// receiver's pool chunks. The header is the user's (tag, flags, remote CQ
/// data; `len` 0); its [`Chunk`]s follow.
///
/// Written by the sender; both fields untrusted. A decoded value has
/// `msg_id != 0` and `1 <= total <= max` (the receiver's maximum).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BounceHdr {
    /// The sender's id for the message (from 1), named by its chunks.
    pub msg_id: u64,
    /// Bytes of the whole message.
    pub total: u64,
}

impl BounceHdr {
    /// Bytes of the payload.
    pub const WIRE: usize = size_of::<BounceHdr>();

    /// Writes the payload into `out`; returns bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let out = room(out, Self::WIRE)?;
        put(out, offset_of!(BounceHdr, msg_id), &self.msg_id.to_le_bytes());
        put(out, offset_of!(BounceHdr, total), &self.total.to_le_bytes());
        Ok(Self::WIRE)
    }

    /// Reads a peer's payload (bytes past the format are ignored); `max` is
    /// the largest message the receiver takes.
    pub fn decode(payload: &[u8], max: u64) -> Result<BounceHdr, WireError> {
        need(payload, Self::WIRE)?;
        let msg_id = u64_at(payload, offset_of!(BounceHdr, msg_id))?;
        let total = u64_at(payload, offset_of!(BounceHdr, total))?;
        if msg_id == 0 {
            return Err(WireError::ZeroMsgId);
        }
        if total == 0 {
            return Err(WireError::Empty);
        }
        if total > max {
            return Err(WireError::TooLarge { total, max });
        }
        Ok(BounceHdr { msg_id, total })
    }
}

/// [`op::CHUNK`]: one fragment of a bounce message, in a run of pool
/// chunks. `msg_id`, `offset` and `len` travel in the header (`tag`,
/// `data`, `len`); the payload is `index` alone ([`Chunk::WIRE`] bytes).
///
/// Written by the sender, which took chunks `index` to
/// `index + run - 1` (`run = len.div_ceil(chunk_size)`, at most
/// [`Chunk::MAX_RUN`]) from the receiver's pool, filled `len` bytes from
/// the first one's start (the chunks lie back to back) and hands them over
/// by publishing the message; every field untrusted. A decoded value has
/// `1 <= len <= chunk_size * MAX_RUN` and `index + run <= n_chunks` (the
/// receiver's pool), so the bytes `[0, len)` from chunk `index` lie in
/// the pool. `msg_id` and `offset` are checked by the caller against the
/// message in progress (no such message has id 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    /// The message's id (header `tag`).
    pub msg_id: u64,
    /// Offset of these bytes in the message (header `data`).
    pub offset: u64,
    /// Bytes in the chunk (header `len`).
    pub len: u32,
    /// Index of the chunk in the receiver's pool (payload).
    pub index: u32,
}

impl Chunk {
    /// Bytes of the payload (the index).
    pub const WIRE: usize = size_of::<u32>();
    /// Most pool chunks one message names.
    pub const MAX_RUN: u32 = 16;

    /// Chunks of `chunk_size` bytes the message's bytes take (a decoded
    /// message's run: 1 to [`Chunk::MAX_RUN`]).
    #[inline]
    pub fn run(&self, chunk_size: usize) -> u32 {
        if self.len as usize <= chunk_size {
            1 // the common case, without a division
        } else {
            (self.len as usize).div_ceil(chunk_size.max(1)) as u32
        }
    }

    /// Writes the payload into `out`; returns the header (`ncells` 0, for
    /// the ring to fill) and the bytes written. Inline (another crate's
    /// hot path: one call per pool fragment each side).
    #[inline]
    pub fn encode(&self, out: &mut [u8]) -> Result<(MsgHdr, usize), WireError> {
        let out = room(out, Self::WIRE)?;
        put(out, 0, &self.index.to_le_bytes());
        let h = MsgHdr { op: op::CHUNK, flags: 0, ncells: 0, len: self.len, tag: self.msg_id, data: self.offset };
        Ok((h, Self::WIRE))
    }

    /// Reads a peer's chunk message, for a pool of `n_chunks` chunks of
    /// `chunk_size` bytes. On [`WireError::ChunkLen`] the index is valid and
    /// that one chunk the receiver's to free (how many more the sender
    /// meant to hand over is unknown).
    #[inline]
    pub fn decode(h: &MsgHdr, payload: &[u8], n_chunks: u32, chunk_size: usize) -> Result<Chunk, WireError> {
        if h.op != op::CHUNK {
            return Err(WireError::WrongOp(h.op));
        }
        let index = u32_at(payload, 0)?;
        if index >= n_chunks {
            return Err(WireError::ChunkIndex(index));
        }
        // The run's chunks, all inside the pool (in u64: no overflow).
        let room = ((n_chunks - index).min(Self::MAX_RUN) as u64).saturating_mul(chunk_size as u64);
        if h.len == 0 || h.len as u64 > room {
            return Err(WireError::ChunkLen { index, len: h.len });
        }
        Ok(Chunk { msg_id: h.tag, offset: h.data, len: h.len, index })
    }
}

/// Payload of [`op::RTS`], request to send (rendezvous): the sender's
/// buffer, for the receiver to read by single copy or to ask for through
/// the pool. The header is the user's (tag, flags, remote CQ data; `len`
/// 0). On the wire: the fields up to `iov`, then `niov` ranges
/// ([`Rts::HEAD`] + `niov` * [`IovRange::SIZE`] bytes).
///
/// Written by the sender; every field untrusted. A decoded value has
/// `msg_id != 0`, `1 <= niov <= MAX_IOV`, `total <= max`, the first `niov`
/// ranges' lengths summing to exactly `total` (no overflow), and the
/// ranges past `niov` zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rts {
    /// The sender's id for the message (from 1), named by the answer.
    pub msg_id: u64,
    /// Bytes of the message.
    pub total: u64,
    /// Ranges used in `iov`.
    pub niov: u32,
    /// Bits of [`rts_flags`](crate::rts_flags).
    pub flags: u32,
    /// The sender's buffer, in its address space.
    pub iov: [IovRange; MAX_IOV],
}

impl Rts {
    /// Bytes before the ranges.
    pub const HEAD: usize = offset_of!(Rts, iov);
    /// Bytes of the longest payload.
    pub const MAX_WIRE: usize = size_of::<Rts>();

    /// A request for `total` bytes in `ranges`; `BadCount` if there are
    /// more than [`MAX_IOV`]. (Not checked: what the decoder checks.)
    pub fn new(
        msg_id: u64,
        total: u64,
        flags: u32,
        ranges: impl IntoIterator<Item = IovRange>,
    ) -> Result<Rts, WireError> {
        let (niov, iov) = collect_ranges(ranges)?;
        Ok(Rts { msg_id, total, niov, flags, iov })
    }

    /// The ranges in use (at most [`MAX_IOV`], whatever `niov` says).
    pub fn iovs(&self) -> &[IovRange] {
        &self.iov[..(self.niov as usize).min(MAX_IOV)]
    }

    /// Writes the payload into `out`; returns bytes written. `BadCount` if
    /// `niov` is over [`MAX_IOV`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        if self.niov as usize > MAX_IOV {
            return Err(WireError::BadCount(self.niov));
        }
        let n = Self::HEAD + self.niov as usize * IovRange::SIZE;
        let out = room(out, n)?;
        put(out, offset_of!(Rts, msg_id), &self.msg_id.to_le_bytes());
        put(out, offset_of!(Rts, total), &self.total.to_le_bytes());
        put(out, offset_of!(Rts, niov), &self.niov.to_le_bytes());
        put(out, offset_of!(Rts, flags), &self.flags.to_le_bytes());
        for (k, r) in self.iovs().iter().enumerate() {
            r.write(out, Self::HEAD + k * IovRange::SIZE);
        }
        Ok(n)
    }

    /// Reads a peer's payload (bytes past the ranges are ignored); `max` is
    /// the largest message the receiver takes.
    pub fn decode(payload: &[u8], max: u64) -> Result<Rts, WireError> {
        need(payload, Self::HEAD)?;
        let msg_id = u64_at(payload, offset_of!(Rts, msg_id))?;
        let total = u64_at(payload, offset_of!(Rts, total))?;
        let niov = u32_at(payload, offset_of!(Rts, niov))?;
        let flags = u32_at(payload, offset_of!(Rts, flags))?;
        if msg_id == 0 {
            return Err(WireError::ZeroMsgId);
        }
        if niov == 0 || niov as usize > MAX_IOV {
            return Err(WireError::BadCount(niov));
        }
        let n = niov as usize;
        need(payload, Self::HEAD + n * IovRange::SIZE)?;
        if total > max {
            return Err(WireError::TooLarge { total, max });
        }
        let mut iov = [IovRange::default(); MAX_IOV];
        for (k, slot) in iov.iter_mut().take(n).enumerate() {
            *slot = IovRange::read(payload, Self::HEAD + k * IovRange::SIZE)?;
        }
        if sum_lens(&iov[..n]) != Some(total) {
            return Err(WireError::LengthMismatch);
        }
        Ok(Rts { msg_id, total, niov, flags, iov })
    }
}

/// [`op::CTS_WRITE`], receiver to sender in a split single copy: "write the
/// message's bytes from `offset` on into these ranges of mine". `msg_id`
/// and `offset` travel in the header (`tag`, `data`); the payload is the
/// fields from `n` on: `n`, `reserved`, then `n` ranges ([`CtsWrite::HEAD`]
/// + `n` * [`IovRange::SIZE`] bytes).
///
/// Written by the receiver; every field untrusted. A decoded value has
/// `msg_id != 0`, `n <= MAX_IOV`, the first `n` ranges' lengths summing to
/// [`CtsWrite::total`] without overflow, `offset + total` not overflowing,
/// and `reserved` and the ranges past `n` zero. Whether `offset + total`
/// lies within the message is the sender's check.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtsWrite {
    /// The sender's id for the message (header `tag`).
    pub msg_id: u64,
    /// Offset in the message of the first byte to write (header `data`).
    pub offset: u64,
    /// Ranges used in `ranges`.
    pub n: u32,
    /// Zero (ignored when read).
    pub reserved: u32,
    /// The receiver's buffer, in its address space.
    pub ranges: [IovRange; MAX_IOV],
}

impl CtsWrite {
    /// Offset of the payload in the type.
    const PAYLOAD_AT: usize = offset_of!(CtsWrite, n);
    /// Payload bytes before the ranges.
    pub const HEAD: usize = offset_of!(CtsWrite, ranges) - Self::PAYLOAD_AT;
    /// Bytes of the longest payload.
    pub const MAX_WIRE: usize = size_of::<CtsWrite>() - Self::PAYLOAD_AT;

    /// A request to write from `offset` on into `ranges`; `BadCount` if
    /// there are more than [`MAX_IOV`].
    pub fn new(msg_id: u64, offset: u64, ranges: impl IntoIterator<Item = IovRange>) -> Result<CtsWrite, WireError> {
        let (n, ranges) = collect_ranges(ranges)?;
        Ok(CtsWrite { msg_id, offset, n, reserved: 0, ranges })
    }

    /// The ranges in use (at most [`MAX_IOV`], whatever `n` says).
    pub fn ranges(&self) -> &[IovRange] {
        &self.ranges[..(self.n as usize).min(MAX_IOV)]
    }

    /// Bytes asked for: the ranges' lengths summed (exact for a decoded
    /// value; saturating otherwise).
    pub fn total(&self) -> u64 {
        self.ranges().iter().fold(0u64, |a, r| a.saturating_add(r.len))
    }

    /// Writes the payload into `out`; returns the header (`len` 0, `ncells`
    /// 0) and the bytes written. `BadCount` if `n` is over [`MAX_IOV`].
    pub fn encode(&self, out: &mut [u8]) -> Result<(MsgHdr, usize), WireError> {
        if self.n as usize > MAX_IOV {
            return Err(WireError::BadCount(self.n));
        }
        let len = Self::HEAD + self.n as usize * IovRange::SIZE;
        let out = room(out, len)?;
        let at = |field: usize| field - Self::PAYLOAD_AT;
        put(out, at(offset_of!(CtsWrite, n)), &self.n.to_le_bytes());
        put(out, at(offset_of!(CtsWrite, reserved)), &0u32.to_le_bytes());
        for (k, r) in self.ranges().iter().enumerate() {
            r.write(out, Self::HEAD + k * IovRange::SIZE);
        }
        let h = MsgHdr { op: op::CTS_WRITE, flags: 0, ncells: 0, len: 0, tag: self.msg_id, data: self.offset };
        Ok((h, len))
    }

    /// Reads a peer's message (payload bytes past the ranges are ignored).
    pub fn decode(h: &MsgHdr, payload: &[u8]) -> Result<CtsWrite, WireError> {
        if h.op != op::CTS_WRITE {
            return Err(WireError::WrongOp(h.op));
        }
        if h.tag == 0 {
            return Err(WireError::ZeroMsgId);
        }
        let n = u32_at(payload, offset_of!(CtsWrite, n) - Self::PAYLOAD_AT)?;
        if n as usize > MAX_IOV {
            return Err(WireError::BadCount(n));
        }
        need(payload, Self::HEAD + n as usize * IovRange::SIZE)?;
        let mut ranges = [IovRange::default(); MAX_IOV];
        for (k, slot) in ranges.iter_mut().take(n as usize).enumerate() {
            *slot = IovRange::read(payload, Self::HEAD + k * IovRange::SIZE)?;
        }
        let total = sum_lens(&ranges[..n as usize]).ok_or(WireError::LengthMismatch)?;
        if h.data.checked_add(total).is_none() {
            return Err(WireError::Overflow);
        }
        Ok(CtsWrite { msg_id: h.tag, offset: h.data, n, reserved: 0, ranges })
    }
}

/// Status of a CTS_BOUNCE that asks for one message's data through the
/// pool while single copy stays usable (its two buffers sit where the
/// kernel's copy is slow): the sender keeps offering single copy.
pub const CTS_BOUNCE_THIS_ONE: u32 = 1;

/// Status of a CTS_BOUNCE that asks for one message's data through the
/// pool to measure it again (the receiver's pick explores the path it does
/// not prefer): as [`CTS_BOUNCE_THIS_ONE`], but the sender's next messages
/// of that size keep the rendezvous, whose single copy the receiver
/// prefers.
pub const CTS_BOUNCE_EXPLORE: u32 = 2;

/// Status of a CTS_BOUNCE that asks for one message's data through the
/// pool because the receiver measured the pool much faster than single
/// copy for that size: as [`CTS_BOUNCE_THIS_ONE`], and the sender's run
/// of eager messages after it is longer.
pub const CTS_BOUNCE_SURE: u32 = 3;

/// The kinds of [`Control`] message.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtrlKind {
    /// [`op::CTS_BOUNCE`]: receiver to sender, send the RTS's data through
    /// the pool.
    CtsBounce = op::CTS_BOUNCE,
    /// [`op::FIN`]: receiver to sender, done with the message's buffer.
    Fin = op::FIN,
    /// [`op::WDONE`]: sender to receiver, the CTS_WRITE's write is done.
    Wdone = op::WDONE,
}

/// A header-only control message ([`op::CTS_BOUNCE`], [`op::FIN`],
/// [`op::WDONE`]): `kind` is the header's `op`, `status` its `len`,
/// `msg_id` its `tag`; `flags` and `data` are 0 and ignored when read.
///
/// Written by either side about a message of the sender's numbering; every
/// field untrusted. A decoded value has one of the three kinds and
/// `msg_id != 0`; `status` is any value (0, or what the writer says is a
/// positive errno: the reader must map unknown values itself).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Control {
    /// Which control message (header `op`).
    pub kind: CtrlKind,
    /// 0, or a positive errno (header `len`); for CTS_BOUNCE, 0 (single
    /// copy unusable with this receiver: stop offering it),
    /// [`CTS_BOUNCE_THIS_ONE`], [`CTS_BOUNCE_EXPLORE`] or [`CTS_BOUNCE_SURE`].
    pub status: u32,
    /// The message it is about (header `tag`).
    pub msg_id: u64,
}

impl Control {
    /// The message's header (`ncells` 0, for the ring to fill).
    pub fn encode(&self) -> MsgHdr {
        MsgHdr { op: self.kind as u8, flags: 0, ncells: 0, len: self.status, tag: self.msg_id, data: 0 }
    }

    /// Reads a peer's control header.
    pub fn decode(h: &MsgHdr) -> Result<Control, WireError> {
        let kind = match h.op {
            op::CTS_BOUNCE => CtrlKind::CtsBounce,
            op::FIN => CtrlKind::Fin,
            op::WDONE => CtrlKind::Wdone,
            o => return Err(WireError::WrongOp(o)),
        };
        if h.tag == 0 {
            return Err(WireError::ZeroMsgId);
        }
        Ok(Control { kind, status: h.len, msg_id: h.tag })
    }
}

// Compile-time layout checks: the payloads' byte offsets are these.
const _: () = {
    use core::mem::align_of;
    assert!(size_of::<IovRange>() == 16 && align_of::<IovRange>() == 8);
    assert!(size_of::<BounceHdr>() == 16 && BounceHdr::WIRE == 16);
    assert!(offset_of!(BounceHdr, total) == 8);
    assert!(size_of::<Chunk>() == 24 && Chunk::WIRE == 4);
    assert!(offset_of!(Rts, total) == 8 && offset_of!(Rts, niov) == 16 && offset_of!(Rts, flags) == 20);
    assert!(Rts::HEAD == 24 && Rts::MAX_WIRE == 24 + 16 * MAX_IOV);
    assert!(offset_of!(CtsWrite, n) == 16 && offset_of!(CtsWrite, reserved) == 20);
    assert!(CtsWrite::HEAD == 8 && CtsWrite::MAX_WIRE == 8 + 16 * MAX_IOV);
    assert!(size_of::<CtrlKind>() == 1 && size_of::<Control>() == 16);
    // Any CTS_WRITE fits an overflow cell; an RTS of more than 3 ranges
    // does not (88 > 72 bytes): it goes by ring only.
    assert!(CtsWrite::MAX_WIRE <= crate::OVF_PAYLOAD);
    assert!(Rts::HEAD + 3 * 16 <= crate::OVF_PAYLOAD && Rts::MAX_WIRE > crate::OVF_PAYLOAD);
};

/// Sizes, offsets and kind numbers of the formats, folded into
/// [`LAYOUT_HASH`](crate::LAYOUT_HASH): a change of wire format changes it.
pub(crate) const HASH_PARTS: [u64; 14] = [
    size_of::<IovRange>() as u64,
    offset_of!(IovRange, len) as u64,
    size_of::<BounceHdr>() as u64,
    offset_of!(BounceHdr, total) as u64,
    Chunk::WIRE as u64,
    Rts::HEAD as u64,
    offset_of!(Rts, niov) as u64,
    offset_of!(Rts, flags) as u64,
    CtsWrite::HEAD as u64,
    (offset_of!(CtsWrite, reserved) - CtsWrite::PAYLOAD_AT) as u64,
    crate::rts_flags::CMA as u64,
    crate::rts_flags::FIN as u64,
    u64::from_le_bytes([
        op::EAGER,
        op::BOUNCE_HDR,
        op::CHUNK,
        op::RTS,
        op::CTS_BOUNCE,
        op::FIN,
        op::CTS_WRITE,
        op::WDONE,
    ]),
    // Which header fields a Chunk and a CtsWrite ride in (tag, data, len).
    (offset_of!(MsgHdr, tag) | offset_of!(MsgHdr, data) << 8 | offset_of!(MsgHdr, len) << 16) as u64,
];

#[cfg(test)]
mod tests;
