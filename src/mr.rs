//! Memory registration (fi_mr(3)), the shared heap, and the mailbox
//! through which a domain's progress engine serves the one-sided
//! operations its peers cannot do themselves.
//!
//! **The RMA file.** A domain's registrations live in a file apart from
//! its region (`shm_layout::rma`), made on the first registration, with
//! no name (as anonymous regions: `O_TMPFILE`, opened by peers through
//! `/proc/<pid>/fd/<fd>` after the same checks), or, when the domain's
//! region is named (`SHMFAB_REGIONS=named`, for ranks in other PID
//! namespaces), named after it with `.rma` added and locked by its owner
//! as a named region is (`shmfab clean` removes a dead owner's). Pids that
//! peers leave in the file (mailbox claims, locks of 16-byte atomics) are
//! judged only by processes of the owner's PID namespace; single copy is
//! not tried with a target of another namespace. It holds the
//! registration table, the striped locks of 16-byte atomics, the
//! mailbox, and the shared heap.
//!
//! **MR mode: `FI_MR_PROV_KEY`, offsets (no `FI_MR_VIRT_ADDR`).** shmfab
//! chooses the keys: a key names the RMA file's descriptor (16 bits), the
//! table slot (16 bits) and a random 32-bit tag drawn anew at every
//! registration (OS-seeded random), so a stale key (of a closed
//! registration, or of an earlier one in the same slot) fails, and a new
//! key cannot be derived from an old one. Remote addresses are offsets from the start of the
//! registration: shared-heap memory sits at another virtual address in
//! every process that maps it, so offsets serve both kinds of memory with
//! one bounds check and reveal nothing of the target's address space.
//! The local descriptor is the key; no local registration is required
//! (no `FI_MR_LOCAL`): shmfab copies from and into any local memory.
//!
//! **Access checks.** Every remote access pins the registration (a CAS on
//! its `ctl` word that needs the key's tag and the open bit), then checks
//! the rights and `offset + length` against the registration's length,
//! before anything is copied: a bad key, range or right fails the
//! operation at the initiator, and the target's memory is untouched. The
//! target checks requests that reach it through the mailbox the same way.
//!
//! **Heap accesses without a pin.** A shared-heap access whose
//! registration the initiator pinned and checked before (its target cache
//! keeps the view) does not write the shared entry, which every initiator
//! of the registration would fight over: it marks its own initiator
//! record in the file busy on the entry's slot (a swap on a line only it
//! writes), loads `ctl` (tag and open bit: a shared read, a cache hit
//! while nobody closes), accesses, and swaps the record idle.
//! A process claims one record per file it maps, on first use (when all
//! [`N_INI`] are held by live processes, or it runs in another PID
//! namespace, it pins as before). See [`enter`] for why a close cannot
//! miss such an access. An idle initiator holds nothing: a close never
//! waits for a peer that is not in the middle of an access.
//!
//! **Close while in use.** Closing clears the open bit (no new pins or
//! record accesses) and waits until the pins in progress are released and
//! the records of live processes busy on its slot are idle (at most
//! [`DRAIN_LIMIT`]; a dead process's record is ignored: it writes nothing
//! more), then frees the slot; heap memory returns to the
//! allocator only then. Pins or busy records left after [`DRAIN_LIMIT`]
//! (an initiator stopped, or dead, in the middle of an access) make close
//! `Busy`: the slot and heap range are quarantined, given to nobody until
//! they are gone (looked at on every registration and close), and a pin's
//! release touches its entry only while the entry holds its tag.

use crate::domain::{Domain, DomainInner};
use crate::error::{Error, ErrorKind, Result};
use crate::flags::*;
use crate::region::Region;
use memmap2::{MmapOptions, MmapRaw};
use shm_layout::rma::*;
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Default bytes of shared heap per domain (`SHMFAB_HEAP_SIZE`): address
/// space only until allocated (the file is sparse; each allocation
/// reserves its pages).
pub const HEAP_SIZE: usize = 256 << 20;

/// How long a close waits for pins in progress to be released.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// An RMA file, ours or a peer's, mapped whole.
pub(crate) struct RmaFile {
    map: MmapRaw,
    file: File,
    /// Our own named file's name (`SHMFAB_REGIONS=named`), unlinked on
    /// drop by the process that made it; None for anonymous files and for
    /// peers' files.
    name: Option<(String, u32)>,
    /// Our pid as this file's claimers and locks hold it: our pid when we
    /// run in the owner's PID namespace, else [`PID_UNKNOWN`] (then we
    /// never judge others' pids either: they are of another namespace).
    pub me: u32,
    n_mr: u32,
    n_mbox: u32,
    heap_off: usize,
    heap_len: usize,
    /// Our initiator record in this file (claimed on first heap access
    /// through it; None: none to be had), see [`RmaFile::record`].
    rec: OnceLock<Option<Rec>>,
}

/// Our claimed initiator record: its index, its word in the mapping (kept
/// so that an access computes no offset) and its idle word.
#[derive(Clone, Copy)]
struct Rec {
    i: usize,
    word: *const crate::sync::AtomicU64,
    idle: u64,
}

// SAFETY: a pointer into the file's mapping, which lives as long as the
// RmaFile that holds the Rec; the word is atomic.
unsafe impl Send for Rec {}
// SAFETY: as above.
unsafe impl Sync for Rec {}

// SAFETY: the mapping is shared memory reached only through atomics and
// raw copies whose races the protocols account for.
unsafe impl Send for RmaFile {}
// SAFETY: as above.
unsafe impl Sync for RmaFile {}

/// Keys hold 16 bits of the RMA file's descriptor: it must lie below this.
const FD_LIMIT: i32 = 1 << 16;

/// `file` at a descriptor below `limit` ([`FD_LIMIT`]: keys hold 16 bits
/// of it): as it is, or duplicated to the lowest free descriptor from 3
/// (the high one is closed; a lock taken on the file stays: it belongs to
/// the open file, which the duplicate shares). Fails clearly when no
/// descriptor below `limit` is free.
fn low_fd(file: File, limit: i32) -> Result<File> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    if fd < limit {
        return Ok(file);
    }
    let d = rustix::io::fcntl_dupfd_cloexec(&file, 3)
        .map_err(|e| Error::with(ErrorKind::from_errno(e.raw_os_error()), format!("RMA file: {e}")))?;
    if d.as_raw_fd() >= limit {
        return Err(Error::with(
            ErrorKind::NoSpc,
            format!(
                "the RMA file got descriptor {fd} and no descriptor below {limit} is free (keys hold 16 bits of it): \
                 close descriptors, or register memory before opening many files"
            ),
        ));
    }
    Ok(File::from(d))
}

fn heap_setting() -> Result<usize> {
    let get = |n: &str| std::env::var(n).ok();
    let v = crate::proto::parse_env(&get, "SHMFAB_HEAP_SIZE", 4096, 1 << 40, crate::proto::Rule::MultipleOf(4096))?;
    Ok(v.unwrap_or(HEAP_SIZE))
}

impl RmaFile {
    /// Makes the RMA file of a domain whose region has `job` and `token`:
    /// with no name, or (`named`: the domain's region is named, for ranks
    /// in other PID namespaces) named after the region with `.rma` added,
    /// locked by its owner as a named region is, so `shmfab clean` tells
    /// a dead owner's file by its free lock and removes it.
    fn create(job: u32, token: u32, named: bool) -> Result<RmaFile> {
        let dir = crate::region::shm_dir()?;
        let name = rma_name(job, token);
        let file = if named {
            let fd = crate::region::open_shm(&name, true).map_err(|e| {
                Error::with(
                    ErrorKind::from_errno(e.raw_os_error()),
                    format!("cannot create {}: {e}", crate::region::shm_path(&name)),
                )
            })?;
            let file = File::from(fd);
            // Blocking, as a region's lock: a scan may hold a shared lock
            // on the new file for an instant (`region::owner_locked`).
            if let Err(e) = rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive) {
                let _ = crate::region::unlink_shm(&name);
                return Err(Error::with(ErrorKind::from_errno(e.raw_os_error()), format!("cannot lock {name}: {e}")));
            }
            file
        } else {
            File::from(crate::region::create_anonymous(&dir, &name)?)
        };
        let owned = named.then(|| (name.clone(), std::process::id()));
        let unlink = |e: Error| {
            if named {
                let _ = crate::region::unlink_shm(&name);
            }
            e
        };
        let file = low_fd(file, FD_LIMIT).map_err(unlink)?;
        let heap_len = heap_setting()?.div_ceil(shm_layout::PAGE) * shm_layout::PAGE;
        let heap_off = heap_offset(N_MR, N_MBOX);
        let total = heap_off + heap_len;
        file.set_len(total as u64).map_err(|e| unlink(e.into()))?;
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, heap_off as u64)
            .map_err(|e| unlink(Error::with(ErrorKind::from_errno(e.raw_os_error()), format!("RMA file: {e}"))))?;
        let map = MmapOptions::new().len(total).map_raw(&file).map_err(|e| unlink(e.into()))?;
        let f = RmaFile {
            map,
            file,
            name: owned,
            me: crate::atomic::my_pid(),
            n_mr: N_MR,
            n_mbox: N_MBOX,
            heap_off,
            heap_len,
            rec: OnceLock::new(),
        };
        let h = f.base() as *mut RmaHeader;
        // SAFETY: our fresh mapping of at least one page; nobody maps it
        // yet (magic is published last).
        unsafe {
            std::ptr::addr_of_mut!((*h).version).write(RMA_VERSION);
            std::ptr::addr_of_mut!((*h).uid).write(crate::region::uid());
            std::ptr::addr_of_mut!((*h).job).write(job);
            std::ptr::addr_of_mut!((*h).token).write(token);
            std::ptr::addr_of_mut!((*h).n_mr).write(N_MR);
            std::ptr::addr_of_mut!((*h).n_mbox).write(N_MBOX);
            std::ptr::addr_of_mut!((*h).heap_off).write(heap_off as u64);
            std::ptr::addr_of_mut!((*h).heap_len).write(heap_len as u64);
            std::ptr::addr_of_mut!((*h).total).write(total as u64);
            std::ptr::addr_of_mut!((*h).pid_ns).write(crate::job::pid_ns());
            // SYNC: publishes the header to the acquire load in attach().
            (*h).magic.store(RMA_MAGIC, Ordering::Release);
        }
        Ok(f)
    }

    /// Maps a peer's RMA file: descriptor `fd` of process `pid`, or the
    /// named file of its region (`named`), which must belong to the domain
    /// region of `job` and `token`.
    fn attach(pid: u32, fd: u32, job: u32, token: u32, named: bool) -> Result<RmaFile> {
        let file = if named {
            let name = rma_name(job, token);
            File::from(crate::region::open_shm(&name, false).map_err(|e| {
                Error::with(
                    ErrorKind::from_errno(e.raw_os_error()),
                    format!("cannot open the peer's RMA file {}: {e}", crate::region::shm_path(&name)),
                )
            })?)
        } else {
            let id = crate::region::RegionId { pid, fd, job, token };
            crate::region::open_anonymous(&id, &crate::region::shm_dir()?)?
        };
        let st = rustix::fs::fstat(&file)?;
        let bad = |why: &str| Error::with(ErrorKind::Inval, format!("RMA file of pid {pid} (fd {fd}): {why}"));
        if st.st_uid != crate::region::uid() || st.st_mode & 0o077 != 0 {
            return Err(bad("not this user's, or not private"));
        }
        let size = st.st_size as usize;
        if size < heap_offset(N_MR, N_MBOX) {
            return Err(bad("too short"));
        }
        let map = MmapOptions::new().len(size).map_raw(&file)?;
        let h = map.as_mut_ptr() as *const RmaHeader;
        // SAFETY: the mapping holds at least a page; fields published
        // before magic (acquire), read volatile: a peer wrote them.
        let (magic, ver, uid, hjob, htok, n_mr, n_mbox, hoff, hlen, total) = unsafe {
            (
                (*h).magic.load(Ordering::Acquire),
                std::ptr::addr_of!((*h).version).read_volatile(),
                std::ptr::addr_of!((*h).uid).read_volatile(),
                std::ptr::addr_of!((*h).job).read_volatile(),
                std::ptr::addr_of!((*h).token).read_volatile(),
                std::ptr::addr_of!((*h).n_mr).read_volatile(),
                std::ptr::addr_of!((*h).n_mbox).read_volatile(),
                std::ptr::addr_of!((*h).heap_off).read_volatile(),
                std::ptr::addr_of!((*h).heap_len).read_volatile(),
                std::ptr::addr_of!((*h).total).read_volatile(),
            )
        };
        // SAFETY: as above.
        let their_ns = unsafe { std::ptr::addr_of!((*h).pid_ns).read_volatile() };
        let our_ns = crate::job::pid_ns();
        let me = if their_ns != 0 && our_ns != 0 && their_ns != our_ns { PID_UNKNOWN } else { crate::atomic::my_pid() };
        if magic != RMA_MAGIC || ver != RMA_VERSION {
            return Err(bad("not an RMA file of this layout (bad key?)"));
        }
        if uid != crate::region::uid() || hjob != job || htok != token {
            return Err(bad("belongs to another domain (stale key?)"));
        }
        if n_mr != N_MR || n_mbox != N_MBOX || hoff != heap_offset(N_MR, N_MBOX) as u64 {
            return Err(bad("bad geometry"));
        }
        if total != size as u64 || hoff.checked_add(hlen) != Some(total) {
            return Err(bad("size does not match its header"));
        }
        Ok(RmaFile {
            map,
            file,
            name: None,
            me,
            n_mr,
            n_mbox,
            heap_off: hoff as usize,
            heap_len: hlen as usize,
            rec: OnceLock::new(),
        })
    }

    fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn fd(&self) -> u32 {
        std::os::fd::AsRawFd::as_raw_fd(&self.file) as u32
    }

    fn header(&self) -> &RmaHeader {
        // SAFETY: page 0 of our mapping, initialised (magic checked).
        unsafe { &*(self.base() as *const RmaHeader) }
    }

    /// Registration slot `i` (< n_mr).
    pub fn entry(&self, i: usize) -> &MrEntry {
        assert!(i < self.n_mr as usize);
        // SAFETY: inside the table (checked), which lies in the mapping
        // (its size was checked against the geometry).
        unsafe { &*(self.base().add(MR_OFFSET + i * std::mem::size_of::<MrEntry>()) as *const MrEntry) }
    }

    /// The striped lock of 16-byte atomics at `at`.
    pub fn lock(&self, at: u64) -> &crate::sync::AtomicU32 {
        let i = ((at >> 4) as usize) % N_LOCKS;
        // SAFETY: inside the lock table; AtomicLock is one atomic word.
        unsafe { &(*(self.base().add(locks_offset(self.n_mr) + i * 64) as *const AtomicLock)).word }
    }

    /// Mailbox slot `i` (< n_mbox).
    pub fn slot(&self, i: usize) -> *mut MboxSlot {
        assert!(i < self.n_mbox as usize);
        // SAFETY: inside the mailbox, which lies in the mapping.
        unsafe { self.base().add(mbox_offset(self.n_mr) + i * std::mem::size_of::<MboxSlot>()) as *mut MboxSlot }
    }

    /// Initiator record `i` (< [`N_INI`]).
    fn ini(&self, i: usize) -> &crate::sync::AtomicU64 {
        assert!(i < N_INI);
        // SAFETY: inside the record table, which lies in the mapping
        // (before the heap, whose offset was checked); one atomic word.
        unsafe {
            &(*(self.base().add(ini_offset(self.n_mr, self.n_mbox) + i * std::mem::size_of::<IniRecord>())
                as *const IniRecord))
                .word
        }
    }

    /// Our initiator record in this file and its idle word, claimed on
    /// first use: None when we run in another PID namespace than the
    /// owner (our pid could not be judged), or when live processes hold
    /// every record (the caller then pins, as before records).
    #[inline]
    pub fn record(&self) -> Option<(&crate::sync::AtomicU64, u64)> {
        let r = self
            .rec
            .get_or_init(|| self.claim_record().map(|i| Rec { i, word: self.ini(i), idle: (self.me as u64) << 32 }));
        // SAFETY: a word of our mapping, which lives as long as self.
        r.as_ref().map(|r| (unsafe { &*r.word }, r.idle))
    }

    /// Claims a free record, else one of a dead process.
    fn claim_record(&self) -> Option<usize> {
        if self.me == PID_UNKNOWN {
            return None;
        }
        let mine = (self.me as u64) << 32;
        let dead = |w: u64| {
            let p = (w >> 32) as u32;
            p != 0 && p != self.me && p != PID_UNKNOWN && !crate::atomic::pid_alive(p)
        };
        for pass in 0..2 {
            for i in 0..N_INI {
                let r = self.ini(i);
                let w = r.load(Ordering::Relaxed);
                if (pass == 0 && w == 0) || (pass == 1 && dead(w)) {
                    // SYNC: acquire pairs with the release CAS that freed
                    // the record (RmaFile::drop); a dead claimer's word is
                    // taken as judged, by a CAS naming it.
                    if r.compare_exchange(w, mine, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                        return Some(i);
                    }
                }
            }
        }
        None
    }

    /// Starts an access to the shared-heap registration of `key` that an
    /// earlier [`RmaFile::pin`] checked (the caller's copy of its view,
    /// against which it checked this access): under our record when we
    /// have one (no write to the shared entry: one swap on our record's
    /// line, one load of the entry's `ctl`), else by [`RmaFile::repin`].
    /// Err as `pin` (the registration closed, or its slot reused).
    #[inline]
    pub fn access(&self, key: Key, view: &MrView, need: Need) -> std::result::Result<Access<'_>, (ErrorKind, String)> {
        let Some((rec, idle)) = self.record() else {
            return self.repin(key, view, need).map(Access::Pin);
        };
        if enter(rec, idle, key.slot, &self.entry(key.slot).ctl, key.tag) {
            return Ok(Access::Rec(Busy { rec, idle }));
        }
        // Closed or reused: the full pin says why (or pins after all).
        self.pin(key, 0, 0, need).map(|mut p| {
            p.view = *view;
            Access::Pin(p)
        })
    }

    /// Requests published to the mailbox so far (a count: the owner's
    /// progress looks at one word).
    fn requests(&self) -> &crate::sync::AtomicU64 {
        &self.header().requests
    }

    /// Heap bytes `[off, off + len)`, when they lie in the heap.
    pub fn heap_at(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        (end <= self.heap_len as u64).then(|| {
            // SAFETY: inside the heap, which lies in the mapping.
            unsafe { self.base().add(self.heap_off + off as usize) }
        })
    }
}

/// What a pinned registration says (read once, after the pin).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MrView {
    pub kind: u32,
    pub access: u32,
    pub len: u64,
    pub nseg: usize,
    pub cntr_rw: u32,
    pub cntr_rr: u32,
    pub seg: [[u64; 2]; MR_SEGS],
}

/// The parts of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub fd: u32,
    pub slot: usize,
    pub tag: u32,
}

impl Key {
    pub fn decode(k: u64) -> Key {
        Key { fd: (k >> 48) as u32, slot: ((k >> 32) & 0xffff) as usize, tag: k as u32 }
    }
    pub fn encode(&self) -> u64 {
        (self.fd as u64) << 48 | (self.slot as u64) << 32 | self.tag as u64
    }
}

/// Rights an access needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    Read,
    Write,
    ReadWrite,
}

impl Need {
    pub(crate) fn bits(self) -> u32 {
        match self {
            Need::Read => mr_access::REMOTE_READ,
            Need::Write => mr_access::REMOTE_WRITE,
            Need::ReadWrite => mr_access::REMOTE_READ | mr_access::REMOTE_WRITE,
        }
    }
}

/// A pin on a registration: released on drop.
pub(crate) struct Pin<'a> {
    e: &'a MrEntry,
    /// The tag the pin was taken under: the release touches the entry
    /// only while it still holds this tag and a pin.
    tag: u32,
    pub view: MrView,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        // A CAS loop, not a blind fetch_sub: should the slot hold another
        // registration by now (it never should: a slot with pins is
        // quarantined, not reused; but the word is shared memory), the
        // release leaves it alone.
        // First guess: open with our pin alone (as repin guesses), so the
        // CAS is the one access to the line.
        let mut c = (self.tag as u64) << 32 | 3;
        while (c >> 32) as u32 == self.tag && (c as u32) >> 1 != 0 {
            // SYNC: release pairs with the acquire loads of close's drain
            // wait and of OwnSt::reclaim.
            match self.e.ctl.compare_exchange_weak(c, c - 2, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(x) => c = x,
            }
        }
    }
}

/// An access in progress to a registration: a pin, or our initiator
/// record marked busy on it. Ends on drop.
pub(crate) enum Access<'a> {
    Pin(#[allow(dead_code)] Pin<'a>),
    Rec(#[allow(dead_code)] Busy<'a>),
}

/// Our initiator record, busy on a registration: made idle on drop.
pub(crate) struct Busy<'a> {
    rec: &'a crate::sync::AtomicU64,
    idle: u64,
}

impl Drop for Busy<'_> {
    #[inline]
    fn drop(&mut self) {
        leave(self.rec, self.idle);
    }
}

/// Marks initiator record `rec` (idle word `idle`) busy on `slot`, then
/// checks that the entry's `ctl` still holds registration `tag` open:
/// whether the access may go on (else the record is idle again).
///
/// Against a close (clear the open bit, then read the record with a
/// read-modify-write, [`busy_on`]): the swap and the close's RMW are
/// ordered on the record's word. If the close's comes later, it sees
/// the record busy and waits for [`leave`]. If earlier, the swap reads
/// from it or from a later RMW of the record (every write to it is one:
/// see [`leave`]), so it acquires from the close's release, the clearing
/// of the open bit happens before the load here, which then sees it
/// cleared. Either way
/// no access runs after a close found nothing to wait for (loom model
/// below). Plain loads on both sides would allow both to miss the other
/// (store buffering).
#[inline]
pub(crate) fn enter(
    rec: &crate::sync::AtomicU64,
    idle: u64,
    slot: usize,
    ctl: &crate::sync::AtomicU64,
    tag: u32,
) -> bool {
    // SYNC: acquire-release: pairs with the RMW of busy_on (see above).
    rec.swap(idle | (slot as u64 + 1), Ordering::AcqRel);
    // SYNC: acquire pairs with the release store that opened the entry
    // (register); the view the caller trusts is its own copy.
    let c = ctl.load(Ordering::Acquire);
    if (c >> 32) as u32 == tag && c & 1 == 1 {
        return true;
    }
    leave(rec, idle);
    false
}

/// Ends an access begun by [`enter`]: a swap, not a store, so that every
/// write to the record after a close's RMW is an RMW. Then the next
/// [`enter`]'s swap reads from the release sequence that the close's RMW
/// heads, and sees the open bit cleared. With a plain store here, a close
/// that read the record busy (access k), then idle (this store), stops
/// waiting; access k + 1's swap would read from this store, not from the
/// close's RMW, and nothing in C11 would order the close's clearing of
/// the open bit before its load of `ctl` (x86 orders it: both RMWs are
/// locked, full barriers; C11 does not). The swap costs one more locked
/// instruction per access, on a line only this process writes.
#[inline]
pub(crate) fn leave(rec: &crate::sync::AtomicU64, idle: u64) {
    // SYNC: release pairs with the acquire loads of a close waiting for
    // the record (wait_unpinned's still_busy) and its RMW (busy_on): the
    // access is done first.
    rec.swap(idle, Ordering::Release);
}

/// Whether record word `rec` says its claimer is accessing `slot`: read
/// by a read-modify-write (it writes the word unchanged), so that it
/// reads the latest word (see [`enter`]). Returns the claimer's pid.
pub(crate) fn busy_on(rec: &crate::sync::AtomicU64, slot: usize) -> Option<u32> {
    // SYNC: acquire-release, pairs with the swaps of enter and leave.
    let w = rec.fetch_add(0, Ordering::AcqRel);
    (w as u32 == slot as u32 + 1).then_some((w >> 32) as u32)
}

/// Whether record `rec`, seen busy on `slot`, still is.
fn still_busy(rec: &crate::sync::AtomicU64, slot: usize) -> bool {
    // SYNC: acquire pairs with the release swap of leave.
    rec.load(Ordering::Acquire) as u32 == slot as u32 + 1
}

/// The initiator records of our file `f` busy on `slot`, of live
/// processes (a dead initiator writes nothing more). Call after the open
/// bit was cleared.
fn busy_records(f: &RmaFile, slot: usize) -> Vec<usize> {
    (0..N_INI).filter(|&i| busy_on(f.ini(i), slot).is_some_and(|p| p == f.me || crate::atomic::pid_alive(p))).collect()
}

impl Drop for RmaFile {
    fn drop(&mut self) {
        if let Some(Some(Rec { i, .. })) = self.rec.get() {
            let mine = (self.me as u64) << 32;
            // SYNC: release pairs with the acquire CAS of the record's
            // next claimer (claim_record). Only our idle claim is freed.
            let _ = self.ini(*i).compare_exchange(mine, 0, Ordering::Release, Ordering::Relaxed);
        }
        // Only the process that made a named file unlinks it (a child
        // forked without exec drops a copy of its parent's).
        if let Some((name, pid)) = &self.name {
            if *pid == std::process::id() {
                let _ = crate::region::unlink_shm(name);
            }
        }
    }
}

/// The name of the RMA file of the domain region of `job` and `token`
/// (this user's): the region's name with `.rma` added.
fn rma_name(job: u32, token: u32) -> String {
    format!("{}.rma", crate::region::region_name(crate::region::uid(), job, token))
}

impl RmaFile {
    /// Pins the registration of `key` for an access of `len` bytes at
    /// `off` needing `need`; checks tag, rights and range.
    pub fn pin(&self, key: Key, off: u64, len: u64, need: Need) -> std::result::Result<Pin<'_>, (ErrorKind, String)> {
        if key.slot >= self.n_mr as usize || key.tag == 0 {
            return Err((ErrorKind::NoKey, format!("key {:#x}: no such registration", key.encode())));
        }
        let e = self.entry(key.slot);
        let mut c = e.ctl.load(Ordering::Acquire);
        loop {
            if (c >> 32) as u32 != key.tag || c & 1 == 0 {
                return Err((ErrorKind::NoKey, format!("key {:#x}: no such registration (stale key?)", key.encode())));
            }
            if (c as u32) >> 1 >= 0x7fff_0000 {
                return Err((ErrorKind::Again, "registration pinned too often".into()));
            }
            // SYNC: acquire pairs with the release store that opened the
            // entry (register), so its fields are visible.
            match e.ctl.compare_exchange_weak(c, c + 2, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => break,
                Err(x) => c = x,
            }
        }
        // SAFETY: the entry's plain fields, written before it opened and
        // not while pinned; volatile: maybe another process wrote them.
        let view = unsafe {
            MrView {
                kind: std::ptr::addr_of!(e.kind).read_volatile(),
                access: std::ptr::addr_of!(e.access).read_volatile(),
                len: std::ptr::addr_of!(e.len).read_volatile(),
                nseg: std::ptr::addr_of!(e.nseg).read_volatile() as usize,
                // Relaxed: an index of a counter that exists before the
                // bind that names it; an access racing a bind may count
                // or not.
                cntr_rw: e.cntr_rw.load(Ordering::Relaxed),
                cntr_rr: e.cntr_rr.load(Ordering::Relaxed),
                seg: std::ptr::addr_of!(e.seg).read_volatile(),
            }
        };
        let pin = Pin { e, tag: key.tag, view };
        let v = &pin.view;
        if v.access & need.bits() != need.bits() {
            return Err((
                ErrorKind::Perm,
                format!("key {:#x}: the registration does not allow remote {need:?}", key.encode()),
            ));
        }
        if off.checked_add(len).is_none_or(|end| end > v.len) {
            return Err((
                ErrorKind::Inval,
                format!("key {:#x}: bytes [{off}, {off}+{len}) are outside its {} bytes", key.encode(), v.len),
            ));
        }
        let segs_ok = v.nseg >= 1
            && v.nseg <= MR_SEGS
            && v.seg[..v.nseg].iter().try_fold(0u64, |t, s| t.checked_add(s[1])) == Some(v.len);
        let kind_ok = match v.kind {
            mr_kind::HEAP => v.nseg == 1 && self.heap_at(v.seg[0][0], v.len).is_some(),
            mr_kind::USER => true,
            _ => false,
        };
        if !segs_ok || !kind_ok {
            return Err((ErrorKind::Io, format!("key {:#x}: corrupt registration", key.encode())));
        }
        Ok(pin)
    }

    /// Pins the registration of `key` again for an access the caller
    /// (needing `need`) checked against `view`, its copy of what an earlier
    /// [`RmaFile::pin`] of the same key read and checked: only the CAS on
    /// the entry's control word (the key's tag and the open bit), none of
    /// the entry's fields read again. Those do not change while the
    /// registration is open under this tag (a new registration in the slot
    /// has a new tag), and the copy, not the shared entry (which a peer
    /// could rewrite), is what the access trusts.
    #[inline]
    pub fn repin(&self, key: Key, view: &MrView, need: Need) -> std::result::Result<Pin<'_>, (ErrorKind, String)> {
        let e = self.entry(key.slot);
        // First guess: open with no pins, so that the CAS is the one
        // access to the line (a load first would fetch it shared, then
        // the CAS again exclusive: two transfers when a peer pins too).
        let mut c = (key.tag as u64) << 32 | 1;
        loop {
            if (c >> 32) as u32 != key.tag || c & 1 == 0 || (c as u32) >> 1 >= 0x7fff_0000 {
                // Closed, reused or pinned too often: the full pin says
                // why (or pins after all: the view stays the caller's).
                return self.pin(key, 0, 0, need).map(|mut p| {
                    p.view = *view;
                    p
                });
            }
            // SYNC: acquire pairs with the release store that opened the
            // entry (register), as in pin.
            match e.ctl.compare_exchange_weak(c, c + 2, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                Err(x) => c = x,
            }
        }
        Ok(Pin { e, tag: key.tag, view: *view })
    }
}

/// `[off, off + len)` of a registration's segments as (address, length)
/// ranges (heap: offsets in the heap). The range was checked by `pin`.
pub(crate) fn ranges(v: &MrView, off: u64, len: u64) -> Ranges {
    let mut out = Ranges { v: [(0, 0); MR_SEGS], n: 0 };
    let (mut skip, mut left) = (off, len);
    for s in &v.seg[..v.nseg.min(MR_SEGS)] {
        if left == 0 {
            break;
        }
        if skip >= s[1] {
            skip -= s[1];
            continue;
        }
        let n = (s[1] - skip).min(left);
        out.v[out.n] = (s[0] + skip, n);
        out.n += 1;
        left -= n;
        skip = 0;
    }
    out
}

/// At most [`MR_SEGS`] (address, length) ranges, without allocating.
pub(crate) struct Ranges {
    v: [(u64, u64); MR_SEGS],
    n: usize,
}

impl std::ops::Deref for Ranges {
    type Target = [(u64, u64)];
    fn deref(&self) -> &[(u64, u64)] {
        &self.v[..self.n]
    }
}

/// A domain's RMA state: its own file (made on first use) and the files of
/// peers it reached, by (pid, fd, token).
#[derive(Default)]
pub(crate) struct RmaDomain {
    own: OnceLock<OwnRma>,
    peers: Mutex<HashMap<(u32, u32, u32), Arc<RmaFile>>>,
    /// The targets endpoints reached lately, with the registration each
    /// last used and when its liveness was last checked (see
    /// [`crate::rma::TargetCache`]); only reached under the domain lock
    /// (no lock of its own: see [`crate::rma::CacheCell`]).
    pub tcache: crate::rma::CacheCell,
    /// Operations this domain started, by path (see [`RmaStats`]).
    pub heap_ops: AtomicU64,
    pub cma_ops: AtomicU64,
    pub mbox_ops: AtomicU64,
}

/// One-sided operations a domain started, by the path they took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RmaStats {
    /// On shared-heap memory (copies and CPU atomics by this process).
    pub heap: u64,
    /// By single copy (process_vm_writev/readv).
    pub cma: u64,
    /// Through the target's progress engine (mailbox requests).
    pub mailbox: u64,
}

/// Our RMA file and its allocation state.
pub(crate) struct OwnRma {
    pub file: Arc<RmaFile>,
    st: Mutex<OwnSt>,
    /// Requests served (compared with the file's request count); left
    /// behind while `cq_queue` holds entries, so that the next progress
    /// pass (which drains it) is not skipped.
    served: AtomicU64,
    /// Remote CQ data taken out of the mailbox (its slot freed at once)
    /// by a pass that could not reach the CQs (an initiator serving its
    /// own mailbox while it waits), oldest first, at most
    /// [`MAX_CQ_QUEUE`]: the next progress pass pushes it into the CQs.
    cq_queue: Mutex<std::collections::VecDeque<CqData>>,
}

/// Most remote CQ data entries held in [`OwnRma`]'s queue; beyond, they
/// stay in their mailbox slots until a progress pass.
pub const MAX_CQ_QUEUE: usize = 1 << 16;

/// Remote CQ data for one of our endpoints, checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CqData {
    /// The target endpoint's section.
    pub ep_index: u32,
    /// The data.
    pub data: u64,
    /// Bytes of the operation.
    pub len: u64,
    /// Completion flags (from the request's `cq_kind`, never a peer's bits).
    pub flags: u64,
}

struct OwnSt {
    used: Vec<bool>,
    /// Free heap ranges (offset, length), sorted by offset.
    free: Vec<(u64, u64)>,
    /// Our own copy of each open registration (tag, what it says): the
    /// mailbox serves requests from it, never from the shared table,
    /// which peers can write.
    views: Vec<Option<(u32, MrView)>>,
    /// Our own copy of the endpoint counters the header publishes.
    ep_cntr: Vec<[u32; 2]>,
    /// Closed registrations whose pins outlived [`DRAIN_LIMIT`]: their
    /// slots (still `used`) and heap ranges go to nobody until the pins
    /// are gone ([`OwnSt::reclaim`]).
    quarantine: Vec<Quarantined>,
}

/// A closed registration that peers still pin (see [`OwnSt::quarantine`]).
struct Quarantined {
    slot: usize,
    /// Its tag: the entry's `ctl` keeps it (open bit clear) until reclaimed.
    tag: u32,
    /// Its heap range, if shared heap.
    heap: Option<(u64, u64)>,
    /// The counters it held bound (index + 1, 0: none): released at reclaim.
    cntr: [u32; 2],
}

impl OwnSt {
    /// Frees the quarantined slots (and heap ranges) whose pins are gone;
    /// returns the counter bindings they held (index + 1) for the caller to
    /// release under the domain lock.
    fn reclaim(&mut self, f: &RmaFile) -> Vec<u32> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.quarantine.len() {
            let q = &self.quarantine[i];
            let e = f.entry(q.slot);
            // SYNC: acquire pairs with the release CAS of Pin::drop: what
            // the last access did is done once its pin is gone.
            if pinned(e.ctl.load(Ordering::Acquire), q.tag) || !busy_records(f, q.slot).is_empty() {
                i += 1;
                continue;
            }
            let q = self.quarantine.swap_remove(i);
            // SYNC: pairs with the acquire loads in pin (a zero tag never
            // matches); the slot is reused only after this store.
            e.ctl.store(0, Ordering::Release);
            self.used[q.slot] = false;
            if let Some((off, len)) = q.heap {
                self.release(off, len);
            }
            out.extend(q.cntr.iter().filter(|&&c| c != 0));
        }
        out
    }

    /// A fresh tag: random (the OS-seeded generator), never 0.
    fn tag(&mut self) -> u32 {
        loop {
            let t = rand::random::<u32>();
            if t != 0 {
                return t;
            }
        }
    }

    fn alloc(&mut self, len: u64) -> Option<u64> {
        let len = len.max(1).div_ceil(shm_layout::PAGE as u64) * shm_layout::PAGE as u64;
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (off, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (off + len, l - len);
        }
        Some(off)
    }

    fn release(&mut self, off: u64, len: u64) {
        let len = len.max(1).div_ceil(shm_layout::PAGE as u64) * shm_layout::PAGE as u64;
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the neighbours.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

impl RmaDomain {
    /// Our RMA file, made on first use.
    pub fn own(&self, dom: &DomainInner) -> Result<&OwnRma> {
        if let Some(o) = self.own.get() {
            return Ok(o);
        }
        let h = dom.region.header();
        let file = RmaFile::create(h.job, h.token, dom.region.id().named())?;
        let free = vec![(0, file.heap_len as u64)];
        let o = OwnRma {
            file: Arc::new(file),
            st: Mutex::new(OwnSt {
                used: vec![false; N_MR as usize],
                free,
                views: vec![None; N_MR as usize],
                ep_cntr: vec![[0; 2]; MAX_EP_CNTR],
                quarantine: Vec::new(),
            }),
            served: AtomicU64::new(0),
            cq_queue: Mutex::new(Default::default()),
        };
        // Another thread may have made one meanwhile: keep the first.
        let _ = self.own.set(o);
        Ok(self.own.get().expect("set above"))
    }

    /// Our RMA file, if made. Inlined: every progress pass asks (out of
    /// line, a call through the GOT on the CQ read's path).
    #[inline]
    pub fn own_if_any(&self) -> Option<&OwnRma> {
        self.own.get()
    }

    /// The RMA file that `key` names in the domain of `addr` (ours when
    /// the address is in our own domain).
    pub fn file_of(&self, dom: &DomainInner, addr: &shm_layout::Address, key: Key) -> Result<Arc<RmaFile>> {
        if crate::region::RegionId::of(addr) == dom.region.id() {
            if let Some(o) = self.own.get() {
                if o.file.fd() == key.fd {
                    return Ok(o.file.clone());
                }
            }
            return Err(Error::with(ErrorKind::Inval, format!("key {:#x}: no such registration", key.encode())));
        }
        let k = (addr.pid, key.fd, addr.token);
        let mut peers = self.peers.lock().map_err(|_| Error::with(ErrorKind::Other, "RMA peer table poisoned"))?;
        if let Some(f) = peers.get(&k) {
            return Ok(f.clone());
        }
        let named = addr.fd == shm_layout::Address::NAMED;
        let f = Arc::new(RmaFile::attach(addr.pid, key.fd, addr.job, addr.token, named)?);
        peers.insert(k, f.clone());
        Ok(f)
    }

    /// Forgets the RMA files of the domain of `addr` (its owner found
    /// dead): their mappings and descriptors go once no operation holds
    /// them.
    pub fn forget_peer(&self, addr: &shm_layout::Address) {
        if let Ok(mut peers) = self.peers.lock() {
            peers.retain(|&(pid, _, token), _| (pid, token) != (addr.pid, addr.token));
        }
    }
}

/// A registered memory region (fi_mr): closed on drop.
pub struct MemoryRegion {
    dom: Arc<DomainInner>,
    key: u64,
    /// Heap allocation (offset, length) to free on close.
    heap: Option<(u64, u64)>,
    ptr: *mut u8,
    len: usize,
    closed: bool,
    /// Closed with pins left (`Busy`): its slot is in the quarantine.
    quarantined: bool,
    /// The counters bound to count remote writes (`[0]`) and reads
    /// (`[1]`), as index + 1 (0: none); each holds one binding in the
    /// domain's counter table (so closing such a counter is `Busy`),
    /// released on rebind and on close.
    cntr: Mutex<[u32; 2]>,
}

// SAFETY: the handle holds plain numbers and a pointer to memory the
// registration describes (the caller's, or the heap's mapping, which the
// domain keeps); its calls take the RMA state's lock.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryRegion {{ key: {:#x}, len: {} }}", self.key, self.len)
    }
}

fn access_bits(access: u64) -> Result<u32> {
    let known = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV;
    if access & !known != 0 {
        return Err(Error::with(ErrorKind::BadFlags, format!("unsupported access flags {:#x}", access & !known)));
    }
    let mut a = 0;
    if access & FI_REMOTE_READ != 0 {
        a |= mr_access::REMOTE_READ;
    }
    if access & FI_REMOTE_WRITE != 0 {
        a |= mr_access::REMOTE_WRITE;
    }
    Ok(a)
}

impl Domain {
    /// The one-sided operations this domain started, by path.
    pub fn rma_stats(&self) -> RmaStats {
        let r = &self.inner.rma;
        RmaStats {
            heap: r.heap_ops.load(Ordering::Relaxed),
            cma: r.cma_ops.load(Ordering::Relaxed),
            mailbox: r.mbox_ops.load(Ordering::Relaxed),
        }
    }

    /// Registers the caller's memory `[ptr, ptr + len)` with `access`
    /// (FI_READ, FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE; FI_SEND and
    /// FI_RECV are taken and mean nothing more: local buffers need no
    /// registration). Peers reach it by single copy or through this
    /// domain's progress engine, at offsets from `ptr`.
    ///
    /// # Safety
    /// The memory must stay valid until [`MemoryRegion::close`] returns
    /// `Ok`, and peers with the key may write it (FI_REMOTE_WRITE) at any
    /// time until then. A close that returns `Busy` (a peer stopped in the
    /// middle of an access) does not end this: the access may still land;
    /// dropping the handle closes it, with the same caveat but no word of
    /// it, so close explicitly before freeing memory peers may be
    /// accessing.
    pub unsafe fn mr_reg(&self, ptr: *mut u8, len: usize, access: u64) -> Result<MemoryRegion> {
        // SAFETY: per this function's contract.
        unsafe { self.mr_regv(&[(ptr, len)], access) }
    }

    /// Registers up to 4 segments as one region (fi_mr_regv): offsets run
    /// through the segments in order.
    ///
    /// # Safety
    /// As [`Domain::mr_reg`], for every segment.
    pub unsafe fn mr_regv(&self, segs: &[(*mut u8, usize)], access: u64) -> Result<MemoryRegion> {
        if segs.is_empty() || segs.len() > MR_SEGS {
            return Err(Error::with(ErrorKind::Inval, format!("1 to {MR_SEGS} segments, got {}", segs.len())));
        }
        let mut seg = [[0u64; 2]; MR_SEGS];
        for (s, &(p, l)) in seg.iter_mut().zip(segs) {
            *s = [p as u64, l as u64];
        }
        let len = segs.iter().map(|s| s.1).sum::<usize>();
        let a = access_bits(access)?;
        let key = register(&self.inner, mr_kind::USER, a, len as u64, segs.len(), seg)?;
        Ok(MemoryRegion {
            dom: self.inner.clone(),
            key,
            heap: None,
            ptr: segs[0].0,
            len,
            closed: false,
            quarantined: false,
            cntr: Mutex::new([0; 2]),
        })
    }

    /// Allocates `len` bytes of shared heap (zeroed) and registers them
    /// with `access`: peers map the heap, so RMA to it is a direct copy by
    /// the initiator and atomics on it are CPU atomics, with no work for
    /// this process. The memory is [`MemoryRegion::as_ptr`]; it lives
    /// until the region is closed.
    pub fn alloc_shared(&self, len: usize, access: u64) -> Result<MemoryRegion> {
        let a = access_bits(access)?;
        let own = self.inner.rma.own(&self.inner)?;
        // Before allocating: quarantined heap ranges may be free by now.
        reclaim(&self.inner, own)?;
        let off = own
            .st
            .lock()
            .map_err(|_| Error::with(ErrorKind::Other, "RMA state poisoned"))?
            .alloc(len as u64)
            .ok_or_else(|| {
                Error::with(
                    ErrorKind::NoMem,
                    format!("the shared heap has no {len} bytes free (SHMFAB_HEAP_SIZE, {} bytes)", own.file.heap_len),
                )
            })?;
        let f = &own.file;
        let plen = (len.max(1)).div_ceil(shm_layout::PAGE) * shm_layout::PAGE;
        let reserve =
            rustix::fs::fallocate(&f.file, rustix::fs::FallocateFlags::empty(), (f.heap_off as u64) + off, plen as u64);
        let ptr = f.heap_at(off, len as u64).expect("allocated inside the heap");
        let fail = |e: Error| {
            if let Ok(mut st) = own.st.lock() {
                st.release(off, len as u64);
            }
            e
        };
        if let Err(e) = reserve {
            return Err(fail(Error::with(
                ErrorKind::from_errno(e.raw_os_error()),
                format!("cannot reserve {plen} bytes of shared heap: {e}"),
            )));
        }
        // SAFETY: our heap allocation, not registered yet: no peer reaches it.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        let mut seg = [[0u64; 2]; MR_SEGS];
        seg[0] = [off, len as u64];
        let key = register(&self.inner, mr_kind::HEAP, a, len as u64, 1, seg).map_err(fail)?;
        Ok(MemoryRegion {
            dom: self.inner.clone(),
            key,
            heap: Some((off, len as u64)),
            ptr,
            len,
            closed: false,
            quarantined: false,
            cntr: Mutex::new([0; 2]),
        })
    }
}

fn register(
    dom: &Arc<DomainInner>,
    kind: u32,
    access: u32,
    len: u64,
    nseg: usize,
    seg: [[u64; 2]; MR_SEGS],
) -> Result<u64> {
    let own = dom.rma.own(dom)?;
    reclaim(dom, own)?;
    let mut st = own.st.lock().map_err(|_| Error::with(ErrorKind::Other, "RMA state poisoned"))?;
    let slot =
        st.used.iter().position(|u| !u).ok_or_else(|| {
            Error::with(ErrorKind::NoSpc, format!("all {N_MR} registrations of the domain are in use"))
        })?;
    st.used[slot] = true;
    let tag = st.tag();
    let e = own.file.entry(slot);
    let p = e as *const MrEntry as *mut MrEntry;
    // SAFETY: a free slot: closed (ctl 0, no pins), so no peer reads its
    // fields; we write them before opening it below.
    unsafe {
        std::ptr::addr_of_mut!((*p).kind).write_volatile(kind);
        std::ptr::addr_of_mut!((*p).access).write_volatile(access);
        std::ptr::addr_of_mut!((*p).len).write_volatile(len);
        std::ptr::addr_of_mut!((*p).nseg).write_volatile(nseg as u32);
        (*p).cntr_rw.store(0, Ordering::Relaxed);
        (*p).cntr_rr.store(0, Ordering::Relaxed);
        std::ptr::addr_of_mut!((*p).seg).write_volatile(seg);
    }
    st.views[slot] = Some((tag, MrView { kind, access, len, nseg, cntr_rw: 0, cntr_rr: 0, seg }));
    // SYNC: publishes the fields to the acquire CAS in RmaFile::pin.
    e.ctl.store((tag as u64) << 32 | 1, Ordering::Release);
    Ok(Key { fd: own.file.fd(), slot, tag }.encode())
}

/// Whether `ctl` holds registration `tag` with pins.
fn pinned(ctl: u64, tag: u32) -> bool {
    (ctl >> 32) as u32 == tag && (ctl as u32) >> 1 != 0
}

/// Waits (at most [`DRAIN_LIMIT`]) until entry `slot` of our file `f`
/// holds no pin of registration `tag` and no live initiator's record is
/// busy on it; whether it got there. Call after the open bit was cleared.
fn wait_unpinned(f: &RmaFile, slot: usize, tag: u32) -> bool {
    let e = f.entry(slot);
    let t0 = Instant::now();
    let mut busy = busy_records(f, slot);
    loop {
        busy.retain(|&i| still_busy(f.ini(i), slot));
        // SYNC: acquire pairs with the release CAS of Pin::drop: what a
        // pinned access did is done once its pin is gone.
        if busy.is_empty() && !pinned(e.ctl.load(Ordering::Acquire), tag) {
            break;
        }
        if t0.elapsed() >= DRAIN_LIMIT {
            return false;
        }
        if t0.elapsed() < Duration::from_millis(1) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    true
}

/// Frees the quarantined slots of `own` whose pins are gone and releases
/// the counter bindings they held.
fn reclaim(dom: &DomainInner, own: &OwnRma) -> Result<()> {
    let mut st = own.st.lock().map_err(|_| Error::with(ErrorKind::Other, "RMA state poisoned"))?;
    if st.quarantine.is_empty() {
        return Ok(());
    }
    let b = st.reclaim(&own.file);
    drop(st);
    unbind_counters(dom, &b)
}

/// Frees the quarantined registrations of `dom` whose pins are gone, if
/// any (a counter bound to one is closed: it may be free by now).
pub(crate) fn reclaim_quarantine(dom: &DomainInner) -> Result<()> {
    match dom.rma.own_if_any() {
        Some(own) => reclaim(dom, own),
        None => Ok(()),
    }
}

fn still_pinned() -> Error {
    Error::with(
        ErrorKind::Busy,
        format!(
            "a peer's access to the registration begun before the close is still in progress after {DRAIN_LIMIT:?} \
             (an initiator stopped or dead in the middle of it): the key is refused to new accesses, but that \
             access may still write the memory; keep the memory valid and call close again (the registration's \
             slot and shared-heap range go to nobody until the access is over)"
        ),
    )
}

impl MemoryRegion {
    /// The key peers name it with (fi_mr_key).
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The local descriptor (fi_mr_desc): the key; shmfab needs none.
    pub fn desc(&self) -> u64 {
        self.key
    }

    /// The start of the memory (for `alloc_shared`, the heap's mapping in
    /// this process).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes registered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Binds a counter of the same domain to count the remote operations
    /// that land in this region (fi_mr_bind with FI_RMA_EVENT):
    /// `FI_REMOTE_WRITE` (writes and atomics), `FI_REMOTE_READ` (reads and
    /// fetching atomics), or both. A new bind for a direction replaces the
    /// counter bound before. The counter stays bound until the region is
    /// closed (or another counter replaces it): closing it meanwhile is
    /// `Busy`, as for a counter bound to an endpoint. `Inval` when the
    /// region or the counter is closed.
    pub fn bind_counter(&self, c: &crate::Counter, flags: u64) -> Result<()> {
        if self.closed {
            return Err(Error::with(ErrorKind::Inval, "the registration is closed"));
        }
        if !Arc::ptr_eq(&c.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "the counter belongs to another domain"));
        }
        if flags & !(FI_REMOTE_READ | FI_REMOTE_WRITE) != 0 || flags == 0 {
            return Err(Error::with(ErrorKind::BadFlags, "bind flags must be FI_REMOTE_READ and/or FI_REMOTE_WRITE"));
        }
        let own = self.dom.rma.own(&self.dom)?;
        let idx1 = c.id as u32 + 1;
        let dirs = [(flags & FI_REMOTE_WRITE != 0), (flags & FI_REMOTE_READ != 0)];
        {
            // Lock order: the domain, then this region's record, then the
            // RMA state (as close).
            let mut dst = self.dom.lock()?;
            // Counter::close sets its flag under the domain lock: a closed
            // counter's index may name another counter by now.
            if c.is_closed() {
                return Err(Error::with(ErrorKind::Inval, "the counter is closed"));
            }
            let mut b = self.cntr.lock().map_err(|_| Error::with(ErrorKind::Other, "registration poisoned"))?;
            for (w, _) in dirs.iter().enumerate().filter(|d| *d.1) {
                dst.cntrs.bind(c.id)?;
                if b[w] != 0 {
                    dst.cntrs.unbind(b[w] as usize - 1);
                }
                b[w] = idx1;
            }
        }
        let mut st = own.st.lock().map_err(|_| Error::with(ErrorKind::Other, "RMA state poisoned"))?;
        let k = Key::decode(self.key);
        if let Some((_, v)) = st.views[k.slot].as_mut() {
            if dirs[0] {
                v.cntr_rw = idx1;
            }
            if dirs[1] {
                v.cntr_rr = idx1;
            }
        }
        // The registration stays open: accesses in progress go on, and an
        // access racing the bind may count or not (Relaxed: the index of
        // a counter that exists already; read after the pin's acquire).
        let e = own.file.entry(k.slot);
        if dirs[0] {
            e.cntr_rw.store(idx1, Ordering::Relaxed);
        }
        if dirs[1] {
            e.cntr_rr.store(idx1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Closes the registration (fi_close): its key fails from now on
    /// (new accesses get `FI_ENOKEY` at the initiator, the memory
    /// untouched). Then waits (at most [`DRAIN_LIMIT`]) for the peers'
    /// accesses already in progress, and:
    /// - `Ok`: none is left; no peer reads or writes the memory any more:
    ///   it may be freed or reused.
    /// - `Busy`: a peer still holds the registration after [`DRAIN_LIMIT`]
    ///   (stopped by a signal or a debugger, or dead, in the middle of an
    ///   access). Its access may still write the memory when it resumes:
    ///   keep the memory valid, and call `close` again (each call waits
    ///   up to [`DRAIN_LIMIT`] again) until it gives `Ok`. The
    ///   registration's slot, shared-heap range and counter bindings are
    ///   kept out of use meanwhile, and freed when the access is over
    ///   (looked at on every registration and close of the domain) even
    ///   if this handle is dropped. An initiator that died holding the
    ///   registration writes nothing more, but shmfab cannot tell it
    ///   from a stopped one: such a slot stays out of use.
    pub fn close(&mut self) -> Result<()> {
        if self.closed {
            return if self.quarantined { self.close_again() } else { Ok(()) };
        }
        self.closed = true;
        let own = self.dom.rma.own(&self.dom)?;
        let k = Key::decode(self.key);
        let e = own.file.entry(k.slot);
        // SYNC: release: ordered before the RMWs of busy_records, which
        // the swap of an initiator's enter may read from (see enter).
        e.ctl.fetch_and(!1, Ordering::AcqRel);
        let drained = wait_unpinned(&own.file, k.slot, k.tag);
        let b = std::mem::take(&mut *self.cntr.lock().unwrap_or_else(|p| p.into_inner()));
        let mut st = own.st.lock().map_err(|_| Error::with(ErrorKind::Other, "RMA state poisoned"))?;
        st.views[k.slot] = None;
        let mut unbind = st.reclaim(&own.file);
        if drained {
            // SYNC: pairs with the acquire loads in pin (a zero tag never matches).
            e.ctl.store(0, Ordering::Release);
            st.used[k.slot] = false;
            if let Some((off, len)) = self.heap {
                st.release(off, len);
            }
            unbind.extend(b.iter().filter(|&&c| c != 0));
        } else {
            st.quarantine.push(Quarantined { slot: k.slot, tag: k.tag, heap: self.heap, cntr: b });
            self.quarantined = true;
        }
        drop(st);
        unbind_counters(&self.dom, &unbind)?;
        if drained {
            Ok(())
        } else {
            Err(still_pinned())
        }
    }

    /// A close after `Busy`: waits again for the pins to go.
    fn close_again(&mut self) -> Result<()> {
        let own = self.dom.rma.own(&self.dom)?;
        let k = Key::decode(self.key);
        wait_unpinned(&own.file, k.slot, k.tag);
        let mut st = own.st.lock().map_err(|_| Error::with(ErrorKind::Other, "RMA state poisoned"))?;
        let unbind = st.reclaim(&own.file);
        let still = st.quarantine.iter().any(|q| q.slot == k.slot && q.tag == k.tag);
        drop(st);
        unbind_counters(&self.dom, &unbind)?;
        if still {
            return Err(still_pinned());
        }
        self.quarantined = false;
        Ok(())
    }
}

/// Releases the counter bindings `b` (index + 1, 0: none) a registration
/// held.
fn unbind_counters(dom: &DomainInner, b: &[u32]) -> Result<()> {
    if b.iter().all(|&i| i == 0) {
        return Ok(());
    }
    let mut dst = dom.lock()?;
    for &i in b.iter().filter(|&&i| i != 0) {
        dst.cntrs.unbind(i as usize - 1);
    }
    Ok(())
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // A quarantined registration (close said Busy) is not waited for
        // again: it is freed when its pins are gone.
        if !self.quarantined {
            let _ = self.close();
        }
    }
}

/// Publishes the remote-event counters endpoint section `idx` has bound
/// (FI_REMOTE_WRITE, FI_REMOTE_READ; None clears): called when the
/// endpoint is enabled and when it closes. Makes the RMA file only when a
/// counter is bound.
pub(crate) fn publish_ep(dom: &DomainInner, idx: usize, rw: Option<usize>, rr: Option<usize>) {
    if idx >= MAX_EP_CNTR || (rw.is_none() && rr.is_none() && dom.rma.own_if_any().is_none()) {
        return;
    }
    let Ok(own) = dom.rma.own(dom) else { return };
    let v = [rw.map_or(0, |c| c as u32 + 1), rr.map_or(0, |c| c as u32 + 1)];
    if let Ok(mut st) = own.st.lock() {
        st.ep_cntr[idx] = v;
    }
    for (w, x) in own.file.header().ep_cntr[idx].iter().zip(v) {
        // SYNC: pairs with the acquire load in ep_counter.
        w.store(x, Ordering::Release);
    }
}

impl RmaFile {
    /// The remote counter (index + 1, 0: none) endpoint section `ep`
    /// publishes for writes (`which` 0) or reads (1).
    #[inline]
    pub fn ep_counter(&self, ep: u32, which: usize) -> u32 {
        self.header().ep_cntr.get(ep as usize).map_or(0, |c| c[which].load(Ordering::Acquire))
    }
}

/// The RMA-file side of a remote counter: counts one event on counter
/// `idx1 - 1` of the domain region `r` (0: none bound) and rings its
/// doorbell.
pub(crate) fn count_remote(r: &Region, idx1: u32) {
    if idx1 == 0 {
        return;
    }
    let (_, _, n_counters) = r.geometry();
    let i = idx1 as usize - 1;
    if i >= n_counters as usize {
        return;
    }
    if let Ok(c) =
        r.at::<shm_layout::Counter>(shm_layout::COUNTERS_OFFSET + i * std::mem::size_of::<shm_layout::Counter>())
    {
        // SAFETY: in the mapping (bounds-checked by `at`); all atomics.
        crate::engine::complete::count(unsafe { &*c }, crate::engine::complete::Val::Success, 1);
        crate::doorbell::ring(&r.header().doorbell);
    }
}

/// Counts one event on our own counter `idx1 - 1` (0: none).
pub(crate) fn count_local(counters: &[shm_layout::Counter], idx1: u32) {
    if let Some(c) = (idx1 as usize).checked_sub(1).and_then(|i| counters.get(i)) {
        crate::engine::complete::count(c, crate::engine::complete::Val::Success, 1);
    }
}

impl OwnRma {
    /// Whether requests wait in our mailbox.
    #[inline]
    pub fn pending(&self) -> bool {
        // SYNC: acquire pairs with the release increment after a request
        // is published (rma::mbox_call).
        self.file.requests().load(Ordering::Acquire) != self.served.load(Ordering::Relaxed)
    }

    /// The request counter initiators bump.
    pub(crate) fn requests_of(f: &RmaFile) -> &crate::sync::AtomicU64 {
        f.requests()
    }

    /// Serves the requests in our mailbox: the writes, reads and atomics
    /// on our memory, and remote CQ data for our endpoints, which any
    /// pass takes out of the mailbox (the slot is freed at once) into our
    /// queue; `cq_data`, given by a progress pass (which holds the CQs),
    /// then receives the queue, oldest first. Each request is checked as
    /// peers' requests are; remote CQ data needs a key naming an open
    /// registration of ours with the right its kind needs (else it is
    /// dropped: no initiator of ours sent it). `cq_data` returns false
    /// when the entry's CQ has no room for it yet (resource management):
    /// it and those after it stay queued.
    pub fn serve(&self, counters: &[shm_layout::Counter], cq_data: Option<&mut dyn FnMut(CqData) -> bool>) {
        let f = &self.file;
        let seen = f.requests().load(Ordering::Acquire);
        let mut all = true;
        // The remote CQ data this scan takes, with its initiator's stamp:
        // one initiator's entries can sit in slots out of their order (it
        // claims whichever slot is free), so they are queued in stamp
        // order. Its earlier entry is published before its later one is,
        // so a scan that sees the later one sees the earlier one too
        // (passes serve under the domain lock: one scan at a time).
        let mut batch: Vec<(u64, CqData)> = Vec::new();
        let room = self.cq_queue.lock().map_or(0, |q| MAX_CQ_QUEUE.saturating_sub(q.len()));
        for i in 0..f.n_mbox as usize {
            let s = f.slot(i);
            // SAFETY: a slot of our mailbox; its word is atomic.
            let word = unsafe { &(*s).word };
            // SYNC: acquire pairs with the initiator's release store of REQ
            // (rma::publish).
            let w = SlotWord(word.load(Ordering::Acquire));
            if w.state() != mbox_state::REQ {
                continue;
            }
            // SAFETY: published request (REQ); read once, then decoded.
            let raw = unsafe { std::ptr::addr_of!((*s).req).read_volatile() };
            let elem = |d: u8| crate::atomic::AtomicType::from_raw(d).map(|t| t.size());
            let req = match MboxReq::decode(&raw, elem) {
                Ok(r) => r,
                Err(_) => {
                    finish(s, w, libc::EPROTO as u32);
                    continue;
                }
            };
            if req.op == mbox_op::CQ_DATA {
                if batch.len() >= room {
                    all = false;
                    continue;
                }
                if let Some(e) = self.cq_entry(&req) {
                    batch.push((req.off, e));
                }
                // SYNC: pairs with the acquire CAS of the next claimer
                // (rma::claim); a CAS, so that nothing but this claim's
                // request is freed.
                let _ = word.compare_exchange(w.0, w.freed().0, Ordering::Release, Ordering::Relaxed);
                continue;
            }
            let st = serve_one(self, s, &req, counters);
            finish(s, w, st);
        }
        let Ok(mut q) = self.cq_queue.lock() else { return };
        batch.sort_by_key(|b| b.0);
        q.extend(batch.into_iter().map(|b| b.1));
        match cq_data {
            // Oldest first. An entry whose CQ has no room (resource
            // management) waits here (and, past MAX_CQ_QUEUE, in the
            // mailbox) for a later pass, with every later entry of its
            // endpoint (their order kept); other endpoints' entries go on
            // (one full CQ holds back no one else's).
            Some(push) => {
                let mut blocked: Vec<u32> = Vec::new();
                for _ in 0..q.len() {
                    let e = q.pop_front().expect("counted");
                    if blocked.contains(&e.ep_index) || !push(e) {
                        if !blocked.contains(&e.ep_index) {
                            blocked.push(e.ep_index);
                        }
                        // Back at the end: the kept ones stay in order.
                        q.push_back(e);
                        all = false;
                    }
                }
            }
            None if !q.is_empty() => all = false,
            None => {}
        }
        if all {
            self.served.store(seen, Ordering::Relaxed);
        }
    }

    /// Checks a remote CQ data request: its key names an open
    /// registration of ours that grants what its kind did; the entry, or
    /// None.
    fn cq_entry(&self, req: &MboxReq) -> Option<CqData> {
        let key = Key::decode(req.key);
        let (flags, need) = match req.aop {
            cq_kind::RMA_WRITE => (FI_RMA | FI_REMOTE_WRITE, mr_access::REMOTE_WRITE),
            cq_kind::ATOMIC_WRITE => (FI_ATOMIC | FI_REMOTE_WRITE, mr_access::REMOTE_WRITE),
            cq_kind::ATOMIC_READ => (FI_ATOMIC | FI_REMOTE_READ, mr_access::REMOTE_READ),
            _ => return None,
        };
        if key.fd != self.file.fd() {
            return None;
        }
        let st = self.st.lock().ok()?;
        match st.views.get(key.slot) {
            Some(Some((tag, v))) if *tag == key.tag && v.access & need == need => {}
            _ => return None,
        }
        Some(CqData { ep_index: req.ep_index, data: req.data, len: req.len, flags: flags | FI_REMOTE_CQ_DATA })
    }
}

/// Counts on the remote counter our endpoint `ep` bound (our private
/// copy), unless it is `mr_cntr`, the registration's (counted once).
fn count_ep_local(own: &OwnRma, counters: &[shm_layout::Counter], ep: u32, which: usize, mr_cntr: u32) {
    let c = own.st.lock().ok().and_then(|st| st.ep_cntr.get(ep as usize).map(|c| c[which])).unwrap_or(0);
    if c != mr_cntr {
        count_local(counters, c);
    }
}

/// Answers the request of claim `w` (state REQ) in slot `s` of our mailbox.
fn finish(s: *mut MboxSlot, w: SlotWord, status: u32) {
    // SAFETY: a slot of our mailbox in state REQ: the initiator waits for DONE.
    unsafe {
        std::ptr::addr_of_mut!((*s).req.status).write_volatile(status);
        // SYNC: pairs with the initiator's acquire load waiting for DONE
        // (rma::wait_done).
        (*s).word.store(w.with_state(mbox_state::DONE).0, Ordering::Release);
    }
}

/// Serves one checked request on our memory; returns 0 or an errno.
fn serve_one(own: &OwnRma, s: *mut MboxSlot, req: &MboxReq, counters: &[shm_layout::Counter]) -> u32 {
    let f = &*own.file;
    use crate::atomic::{apply, load_elem, store_elem, AtomicOp, AtomicType};
    let key = Key::decode(req.key);
    let (need, len) = match req.op {
        mbox_op::WRITE => (Need::Write, req.len),
        mbox_op::READ => (Need::Read, req.len),
        _ if req.aop == crate::atomic::AtomicOp::Read as u8 => (Need::Read, req.len),
        _ if req.fetch != 0 => (Need::ReadWrite, req.len),
        _ => (Need::Write, req.len),
    };
    let pin = match f.pin(key, req.off, len, need) {
        Ok(p) => p,
        Err((k, _)) => return k.errno().unsigned_abs(),
    };
    // The pin keeps a close out until we are done; what the registration
    // says comes from our own copy (the shared entry is peers' to write).
    let v = match own.st.lock().ok().and_then(|st| st.views[key.slot]) {
        Some((tag, v)) if tag == key.tag => v,
        _ => return ErrorKind::NoKey.errno().unsigned_abs(),
    };
    if v.access & need.bits() != need.bits() {
        return ErrorKind::Perm.errno().unsigned_abs();
    }
    if req.off.checked_add(len).is_none_or(|end| end > v.len) {
        return ErrorKind::Inval.errno().unsigned_abs();
    }
    // SAFETY: the slot's data area, ours, while the initiator waits.
    let data = unsafe { &mut (*s).data };
    let at = |a: u64| -> *mut u8 {
        if v.kind == mr_kind::HEAP {
            f.heap_at(a, 0).expect("checked by pin")
        } else {
            a as *mut u8
        }
    };
    match req.op {
        mbox_op::WRITE | mbox_op::READ => {
            let mut done = 0usize;
            for &(a, n) in ranges(&v, req.off, req.len).iter() {
                let p = at(a);
                // SAFETY: inside a registration pinned for this access
                // (our memory: the caller's or the heap); data holds len
                // bytes (decoded).
                unsafe {
                    if req.op == mbox_op::WRITE {
                        crate::copy::copy(data.as_ptr().add(done), p, n as usize);
                    } else {
                        crate::copy::copy(p, data.as_mut_ptr().add(done), n as usize);
                    }
                }
                done += n as usize;
            }
            if req.count == 1 {
                let which = (req.op == mbox_op::READ) as usize;
                count_local(counters, if which == 0 { v.cntr_rw } else { v.cntr_rr });
                count_ep_local(own, counters, req.ep_index, which, if which == 0 { v.cntr_rw } else { v.cntr_rr });
            }
            drop(pin);
            0
        }
        _ => {
            let (Some(dt), Some(op)) = (AtomicType::from_raw(req.dtype), AtomicOp::from_raw(req.aop)) else {
                return libc::EINVAL as u32;
            };
            let call = if op.is_compare() {
                crate::atomic::AtomicCall::Compare
            } else if req.fetch != 0 {
                crate::atomic::AtomicCall::Fetch
            } else {
                crate::atomic::AtomicCall::Write
            };
            if !crate::atomic::valid(call, dt, op) {
                return libc::EOPNOTSUPP as u32;
            }
            let sz = dt.size();
            let rs = ranges(&v, req.off, req.len);
            if rs.len() != 1 || !rs[0].0.is_multiple_of(sz.min(8) as u64) {
                return libc::EINVAL as u32;
            }
            let base = at(rs[0].0);
            let n = req.count as usize;
            for i in 0..n {
                let a = load_elem(&data[i * sz..(i + 1) * sz]);
                let c = load_elem(&data[(n + i) * sz..(n + i + 1) * sz]);
                // SAFETY: an aligned element inside the pinned registration.
                let old = unsafe { apply(dt, op, base.add(i * sz), a, c, f.lock(rs[0].0 + (i * sz) as u64), f.me) };
                store_elem(&mut data[i * sz..(i + 1) * sz], old);
            }
            // data: 0 on the operation's last segment in this
            // registration, the one the counters count; 1 on the others.
            let counted = req.data == 0;
            if counted && op != AtomicOp::Read {
                count_local(counters, v.cntr_rw);
                count_ep_local(own, counters, req.ep_index, 0, v.cntr_rw);
            }
            if counted && req.fetch != 0 {
                count_local(counters, v.cntr_rr);
                count_ep_local(own, counters, req.ep_index, 1, v.cntr_rr);
            }
            drop(pin);
            0
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A peer that rewrites our shared registration entry (here: grants
    /// itself the write right) gains nothing: the mailbox serves from our
    /// own copy.
    #[test]
    fn mailbox_ignores_forged_entries() {
        let fabric = crate::Fabric::open().unwrap();
        let dom = fabric.domain().unwrap();
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf outlives the registration (closed below).
        let mut mr = unsafe { dom.mr_reg(buf.as_mut_ptr(), 4096, FI_REMOTE_READ).unwrap() };
        let own = dom.inner.rma.own_if_any().unwrap();
        let k = Key::decode(mr.key());
        let e = own.file.entry(k.slot) as *const MrEntry as *mut MrEntry;
        let s = own.file.slot(0);
        // SAFETY: our own mapping; we play the peer that writes it.
        unsafe {
            std::ptr::addr_of_mut!((*e).access).write_volatile(mr_access::REMOTE_READ | mr_access::REMOTE_WRITE);
            let w = SlotWord::new(mbox_state::FREE, 0, 0).claimed_by(std::process::id());
            (*s).word.store(w.0, Ordering::Relaxed);
            let req = MboxReq { op: mbox_op::WRITE, key: mr.key(), len: 16, count: 1, ..Default::default() };
            std::ptr::addr_of_mut!((*s).req).write_volatile(req);
            (&mut (*s).data)[..16].fill(0xff);
            (*s).word.store(w.with_state(mbox_state::REQ).0, Ordering::Release);
        }
        own.file.requests().fetch_add(1, Ordering::Release);
        own.serve(dom.inner.counters(), None);
        // SAFETY: as above.
        let (state, status) = unsafe { (SlotWord((*s).word.load(Ordering::Acquire)).state(), (*s).req.status) };
        assert_eq!(state, mbox_state::DONE);
        assert_eq!(status, libc::EPERM as u32);
        assert!(buf.iter().all(|&b| b == 0), "the forged right let a write through");
        mr.close().unwrap();
    }

    /// A close that finds a peer's pin left after DRAIN_LIMIT is Busy and
    /// gives the slot, the heap range and the counter binding to nobody
    /// until the pin goes; a second close then succeeds.
    #[test]
    fn close_with_a_pin_left_quarantines_the_registration() {
        let fabric = crate::Fabric::open().unwrap();
        let dom = fabric.domain().unwrap();
        let rw = FI_REMOTE_READ | FI_REMOTE_WRITE;
        let mut mr = dom.alloc_shared(4096, rw).unwrap();
        let own = dom.inner.rma.own_if_any().unwrap();
        let k = Key::decode(mr.key());
        let c = dom.cntr_open().unwrap();
        mr.bind_counter(&c, FI_REMOTE_WRITE).unwrap();
        // A peer's access in progress (stopped in the middle of it).
        let pin = own.file.pin(k, 0, 8, Need::Write).unwrap();
        let t0 = Instant::now();
        assert_eq!(mr.close().unwrap_err().kind(), ErrorKind::Busy);
        assert!(t0.elapsed() >= DRAIN_LIMIT);
        assert_eq!(own.file.pin(k, 0, 8, Need::Write).err().map(|e| e.0), Some(ErrorKind::NoKey));
        assert_eq!(c.close().unwrap_err().kind(), ErrorKind::Busy, "the binding went with the close");
        let other = dom.alloc_shared(4096, rw).unwrap();
        assert_ne!(Key::decode(other.key()).slot, k.slot, "a pinned slot was reused");
        assert_ne!(other.as_ptr(), mr.as_ptr(), "a pinned heap range was reused");
        drop(pin);
        // The counter's close frees the unpinned registration first.
        c.close().unwrap();
        mr.close().unwrap();
        let again = dom.alloc_shared(4096, rw).unwrap();
        assert_eq!((Key::decode(again.key()).slot, again.as_ptr()), (k.slot, mr.as_ptr()));
        assert!(own.file.pin(Key::decode(again.key()), 0, 8, Need::Write).is_ok());

        // Dropped after Busy: freed by the next registration once unpinned.
        let mut mr = again;
        let k = Key::decode(mr.key());
        let pin = own.file.pin(k, 0, 8, Need::Read).unwrap();
        assert_eq!(mr.close().unwrap_err().kind(), ErrorKind::Busy);
        let p = mr.as_ptr();
        drop(mr);
        drop(pin);
        let third = dom.alloc_shared(4096, rw).unwrap();
        assert_eq!((Key::decode(third.key()).slot, third.as_ptr()), (k.slot, p));
    }

    /// An initiator record busy on a registration holds its close as a
    /// pin does (Busy after DRAIN_LIMIT, quarantined until the record is
    /// idle); a dead process's busy record holds nothing; an idle record
    /// holds nothing; an access after the close is refused.
    #[test]
    fn busy_initiator_records_hold_a_close() {
        let fabric = crate::Fabric::open().unwrap();
        let dom = fabric.domain().unwrap();
        let rw = FI_REMOTE_READ | FI_REMOTE_WRITE;
        let own = dom.inner.rma.own(&dom.inner).unwrap();
        let f = &own.file;
        let (rec, idle) = f.record().unwrap();
        let mut mr = dom.alloc_shared(4096, rw).unwrap();
        let k = Key::decode(mr.key());
        let view = f.pin(k, 0, 8, Need::Write).unwrap().view;
        let a = f.access(k, &view, Need::Write).unwrap();
        assert!(matches!(a, Access::Rec(_)));
        assert_eq!(rec.load(Ordering::Relaxed), idle | (k.slot as u64 + 1));
        drop(a);
        assert_eq!(rec.load(Ordering::Relaxed), idle);
        // A dead process's record, busy on the slot.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let other = (0..N_INI).find(|&i| f.ini(i).load(Ordering::Relaxed) == 0).unwrap();
        f.ini(other).store((dead as u64) << 32 | (k.slot as u64 + 1), Ordering::Relaxed);
        let t0 = Instant::now();
        mr.close().unwrap();
        assert!(t0.elapsed() < DRAIN_LIMIT);
        assert!(f.access(k, &view, Need::Write).is_err(), "an access after the close");
        assert_eq!(rec.load(Ordering::Relaxed), idle);
        f.ini(other).store(0, Ordering::Relaxed);
        // Ours (live), busy: Busy, then freed once idle.
        let mut mr = dom.alloc_shared(4096, rw).unwrap();
        let k = Key::decode(mr.key());
        let view = f.pin(k, 0, 8, Need::Write).unwrap().view;
        let a = f.access(k, &view, Need::Write).unwrap();
        assert_eq!(mr.close().unwrap_err().kind(), ErrorKind::Busy);
        let p = mr.as_ptr();
        let again = dom.alloc_shared(4096, rw).unwrap();
        assert_ne!(again.as_ptr(), p, "a busy heap range was reused");
        drop(a);
        mr.close().unwrap();
        let third = dom.alloc_shared(4096, rw).unwrap();
        assert_eq!((Key::decode(third.key()).slot, third.as_ptr()), (k.slot, p));
    }

    /// The release of a pin leaves the entry alone once it holds another
    /// tag (a peer's late unpin cannot corrupt a reused slot).
    #[test]
    fn a_late_unpin_leaves_another_registration_alone() {
        let fabric = crate::Fabric::open().unwrap();
        let dom = fabric.domain().unwrap();
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf outlives the registration (closed below).
        let mut mr = unsafe { dom.mr_reg(buf.as_mut_ptr(), 4096, FI_REMOTE_READ).unwrap() };
        let own = dom.inner.rma.own_if_any().unwrap();
        let k = Key::decode(mr.key());
        let e = own.file.entry(k.slot);
        let pin = own.file.pin(k, 0, 8, Need::Read).unwrap();
        let mine = e.ctl.load(Ordering::Relaxed);
        let forged = ((k.tag ^ 1) as u64) << 32 | 2 | 1;
        e.ctl.store(forged, Ordering::Relaxed);
        drop(pin);
        assert_eq!(e.ctl.load(Ordering::Relaxed), forged);
        e.ctl.store(mine - 2, Ordering::Relaxed);
        mr.close().unwrap();
    }

    /// A file at a descriptor at or above the limit keys can hold moves to
    /// a lower one, or fails clearly when none is free (the limit is
    /// 65536; this host's RLIMIT_NOFILE may not reach it, so the test
    /// lowers it).
    #[test]
    fn rma_file_descriptors_fit_keys() {
        use std::os::fd::{AsRawFd, FromRawFd};
        let f = File::open("/dev/null").unwrap();
        // SAFETY: dup2 onto a descriptor far above those the test uses;
        // the File takes ownership of the new descriptor.
        let high = unsafe {
            let d = libc::dup2(f.as_raw_fd(), 900);
            assert_eq!(d, 900);
            File::from_raw_fd(d)
        };
        let low = low_fd(high, 800).unwrap();
        assert!(low.as_raw_fd() < 800, "{}", low.as_raw_fd());
        // SAFETY: fd 900 was closed by low_fd (its File dropped): a probe.
        assert_eq!(unsafe { libc::fcntl(900, libc::F_GETFD) }, -1);
        // SAFETY: as above.
        let high = unsafe { File::from_raw_fd(libc::dup2(f.as_raw_fd(), 900)) };
        let e = low_fd(high, 3).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoSpc, "{e}");
        let ok = File::open("/dev/null").unwrap();
        let n = ok.as_raw_fd();
        assert_eq!(low_fd(ok, FD_LIMIT).unwrap().as_raw_fd(), n);
    }

    /// Remote CQ data is taken only for a key naming an open registration
    /// of ours with the right its kind needs; a pass without the CQs
    /// frees its slot at once and queues it, flagged by its kind.
    #[test]
    fn cq_data_needs_a_key() {
        let fabric = crate::Fabric::open().unwrap();
        let dom = fabric.domain().unwrap();
        let mut buf = vec![0u8; 4096];
        // SAFETY: buf outlives the registration (closed below).
        let mut mr = unsafe { dom.mr_reg(buf.as_mut_ptr(), 4096, FI_REMOTE_READ).unwrap() };
        let own = dom.inner.rma.own_if_any().unwrap();
        let bad_tag = Key { tag: Key::decode(mr.key()).tag ^ 1, ..Key::decode(mr.key()) }.encode();
        let cases = [
            (mr.key(), cq_kind::ATOMIC_READ, Some(FI_ATOMIC | FI_REMOTE_READ | FI_REMOTE_CQ_DATA)),
            (mr.key(), cq_kind::RMA_WRITE, None), // no remote write right
            (bad_tag, cq_kind::ATOMIC_READ, None),
            (mr.key(), 7, None), // unknown kind
        ];
        for (i, &(key, kind, want)) in cases.iter().enumerate() {
            let s = own.file.slot(i);
            let w = SlotWord::new(mbox_state::FREE, 0, 0).claimed_by(std::process::id());
            // SAFETY: our own mapping; we play the peer that writes it.
            unsafe {
                let req =
                    MboxReq { op: mbox_op::CQ_DATA, key, aop: kind, data: i as u64, len: 8, ..Default::default() };
                std::ptr::addr_of_mut!((*s).req).write_volatile(req);
                (*s).word.store(w.with_state(mbox_state::REQ).0, Ordering::Release);
            }
            own.file.requests().fetch_add(1, Ordering::Release);
            own.serve(dom.inner.counters(), None);
            // SAFETY: as above.
            assert_eq!(SlotWord(unsafe { (*s).word.load(Ordering::Acquire) }), w.freed(), "case {i}: slot freed");
            let q: Vec<CqData> = own.cq_queue.lock().unwrap().drain(..).collect();
            let e = want.map(|flags| CqData { ep_index: 0, data: i as u64, len: 8, flags });
            assert_eq!(q, e.into_iter().collect::<Vec<_>>(), "case {i}");
        }
        mr.close().unwrap();
    }

    #[test]
    fn keys_round_trip() {
        let k = Key { fd: 0xbeef, slot: 1023, tag: 0xdead_beef };
        assert_eq!(Key::decode(k.encode()), k);
    }

    #[test]
    fn heap_allocator_merges() {
        let mut st =
            OwnSt { used: vec![], free: vec![(0, 16 * 4096)], views: vec![], ep_cntr: vec![], quarantine: vec![] };
        let a = st.alloc(1).unwrap();
        let b = st.alloc(5000).unwrap();
        let c = st.alloc(4096).unwrap();
        assert_eq!((a, b, c), (0, 4096, 3 * 4096));
        st.release(b, 5000);
        st.release(a, 1);
        st.release(c, 4096);
        assert_eq!(st.free, vec![(0, 16 * 4096)]);
        assert!(st.alloc(17 * 4096).is_none());
        let t1 = st.tag();
        assert_ne!(t1, st.tag());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::AtomicU64;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;

    const SLOT: usize = 3;
    const TAG: u32 = 7;
    const IDLE: u64 = 42 << 32;

    /// An initiator accesses registered memory twice under its record
    /// (enter, write, leave) while the owner closes the registration
    /// (clear the open bit, read the record with an RMW, wait while it is
    /// busy on the slot) and then reuses the memory: whatever the
    /// interleaving, no access races the reuse (loom checks the
    /// ordering of the plain memory), and none lands after it. Fails with
    /// busy_on's RMW replaced by a load (checked).
    #[test]
    fn loom_record_access_against_close() {
        loom::model(|| {
            let ctl = Arc::new(AtomicU64::new((TAG as u64) << 32 | 1));
            let rec = Arc::new(AtomicU64::new(IDLE));
            let mem = Arc::new(UnsafeCell::new(0u64));
            let (c, r, m) = (ctl.clone(), rec.clone(), mem.clone());
            let ini = loom::thread::spawn(move || {
                let mut n = 0;
                for _ in 0..2 {
                    if enter(&r, IDLE, SLOT, &c, TAG) {
                        // SAFETY: loom's cell; the protocol under test
                        // orders this write against the owner's.
                        m.with_mut(|p| unsafe { *p += 1 });
                        leave(&r, IDLE);
                        n += 1;
                    }
                }
                n
            });
            ctl.fetch_and(!1, Ordering::AcqRel);
            if busy_on(&rec, SLOT).is_some() {
                while still_busy(&rec, SLOT) {
                    loom::thread::yield_now();
                }
            }
            // Closed: the memory is the owner's again.
            // SAFETY: as above.
            let before = mem.with_mut(|p| unsafe {
                let b = *p;
                *p = 100;
                b
            });
            let n = ini.join().unwrap();
            assert_eq!(before, n, "an access ran after the close found nothing to wait for");
            // SAFETY: as above (joined).
            assert_eq!(mem.with(|p| unsafe { *p }), 100);
            assert_eq!(rec.load(Ordering::Relaxed), IDLE);
        });
    }

    /// A record busy on another slot does not hold the close, and an
    /// access to another registration in the same slot (another tag) is
    /// refused.
    #[test]
    fn loom_record_names_its_registration() {
        loom::model(|| {
            let ctl = Arc::new(AtomicU64::new((TAG as u64) << 32 | 1));
            let rec = Arc::new(AtomicU64::new(IDLE));
            let (c, r) = (ctl.clone(), rec.clone());
            let ini = loom::thread::spawn(move || {
                let other = enter(&r, IDLE, SLOT + 1, &c, TAG);
                let stale = enter(&r, IDLE, SLOT, &c, TAG ^ 1);
                assert!(!stale, "a stale tag entered");
                if other {
                    leave(&r, IDLE);
                }
            });
            ctl.fetch_and(!1, Ordering::AcqRel);
            let _ = busy_on(&rec, SLOT);
            ini.join().unwrap();
            assert_eq!(busy_on(&rec, SLOT), None);
        });
    }
}
