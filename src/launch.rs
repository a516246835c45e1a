//! Launch: the [`World`] that the ranks of a job build, from what
//! [`crate::job`] reads of the launcher's environment.
//!
//! Ranks meet in a boot region: each writes its pid and endpoint addresses,
//! waits for all (a rank that never arrives is named after
//! `SHMFAB_BOOT_TIMEOUT` seconds, default 120), and reads every entry. By
//! default the region has no name: the first rank to bind the job's
//! abstract Unix socket `@shmfab.<uid>.<jobhash>.boot` makes it and hands
//! its descriptor to the others, so nothing is left whenever the job dies.
//! With `SHMFAB_REGIONS=named` it is the file `shmfab.<uid>.<jobhash>.boot`
//! (made O_EXCL by the first to come, unlinked by the last to arrive, or by
//! the last to leave a failed exchange). Two jobs on one node have
//! different job ids and never see each other. No MPI library is needed.

use crate::cq::{CqErrEntry, CqTaggedEntry};
use crate::error::{Error, ErrorKind, Result};
use crate::job::{owner_alive, proc_start_time, Launch, Launcher};
use crate::region::uid;
use crate::sync::Ordering;
use crate::{AddressVector, CompletionQueue, CqAttr, Domain, Endpoint, Fabric, FiAddr, FI_RECV, FI_TRANSMIT};
use memmap2::{MmapOptions, MmapRaw};
use shm_layout::{Address, BootEntry, BootHeader, LAYOUT_HASH, LAYOUT_VERSION, MAGIC, PAGE};
use std::cell::{Cell, RefCell};
use std::fs::File;
use std::time::{Duration, Instant};

/// Name of a job's boot region.
pub fn boot_name(job: &str) -> String {
    format!("{}{}.{:08x}.boot", crate::region::PREFIX, uid(), crate::region::job_hash(job))
}

struct Boot {
    map: MmapRaw,
    name: String,
    /// Whether the region has a name (`SHMFAB_REGIONS=named`); else it is
    /// anonymous, handed out by its host through the job's socket.
    named: bool,
    size: usize,
    /// Holds a shared lock on the region while this rank is in the
    /// exchange: a boot region nobody holds a lock on is a leftover
    /// (`region::locked`), whatever pids it names.
    lock: File,
    /// The host's listening socket (anonymous mode): the rank that bound
    /// the job's abstract socket made the region and hands it to the
    /// others until every rank has arrived.
    host: Option<rustix::fd::OwnedFd>,
}

impl Boot {
    fn header(&self) -> &BootHeader {
        // SAFETY: the mapping is at least a page, page aligned; the header
        // holds atomics and plain integers.
        unsafe { &*(self.map.as_ptr() as *const BootHeader) }
    }

    fn entry(&self, r: usize) -> &BootEntry {
        debug_assert!(r < self.size);
        // SAFETY: r < size, and the mapping holds size entries after the
        // header page (checked at open).
        unsafe { &*(self.map.as_ptr().add(PAGE + r * std::mem::size_of::<BootEntry>()) as *const BootEntry) }
    }

    /// Removes a named region's name, if it still names this region (a
    /// later job of the same id may have made a new one).
    fn unlink(&self) {
        if self.named {
            unlink_if_same(&self.name, &self.lock);
        }
    }

    /// The exchange failed for this rank: the last rank to leave a named
    /// region (no other holds a lock) removes it, so a job that never
    /// started leaves nothing behind either. (An anonymous one goes with
    /// its last holder.)
    fn abandon(&self) {
        use rustix::fs::{flock, FlockOperation};
        if !self.named {
            return;
        }
        let _ = flock(&self.lock, FlockOperation::Unlock);
        if flock(&self.lock, FlockOperation::NonBlockingLockExclusive).is_ok() {
            self.unlink();
        }
    }

    /// The host's duty while it waits: hand the region to every rank
    /// waiting on the job's socket (this user's only).
    fn serve(&self) {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags};
        use std::os::fd::AsFd;
        let Some(l) = &self.host else { return };
        while let Ok(c) = rustix::net::accept_with(l, SocketFlags::CLOEXEC) {
            if rustix::net::sockopt::socket_peercred(&c).map_or(true, |cr| cr.uid.as_raw() != uid()) {
                continue; // another user's process: it gets nothing
            }
            let fds = [self.lock.as_fd()];
            let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut cm = SendAncillaryBuffer::new(&mut space);
            cm.push(SendAncillaryMessage::ScmRights(&fds));
            let _ = rustix::net::sendmsg(&c, &[std::io::IoSlice::new(b"b")], &mut cm, SendFlags::NOSIGNAL);
        }
    }

    /// Creates or opens the boot region of `job` for `size` ranks.
    fn open(job: &str, size: usize, deadline: Instant, backing: crate::region::Backing) -> Result<Boot> {
        match backing {
            crate::region::Backing::Named => Boot::open_named(job, size, deadline),
            crate::region::Backing::Anonymous => Boot::open_anonymous(job, size, deadline),
        }
    }

    /// Anonymous mode: ranks meet on an abstract Unix socket named after
    /// the job (no file: the name goes with the process that holds it).
    /// The first rank to bind it hosts: it makes an anonymous boot region
    /// and hands its descriptor to each rank that connects. A job killed
    /// at any moment leaves nothing behind.
    fn open_anonymous(job: &str, size: usize, deadline: Instant) -> Result<Boot> {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let name = boot_name(job);
        check_size(size, "ranks")?;
        let bytes = PAGE + size * std::mem::size_of::<BootEntry>();
        let addr = SocketAddrUnix::new_abstract_name(name.as_bytes())?;
        let sock_err = |what: &str, e: rustix::io::Errno| {
            Error::with(
                ErrorKind::from_errno(e.raw_os_error()),
                format!("job {job}: {what} its boot socket @{name}: {e}"),
            )
        };
        loop {
            let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
            let l = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, flags, None)?;
            match rustix::net::bind(&l, &addr) {
                Ok(()) => {
                    let dir = crate::region::shm_dir()?;
                    let fd = crate::region::create_anonymous(&dir, &format!("{name}.new")).map_err(|e| {
                        Error::with(
                            ErrorKind::from_errno(e.raw_os_error()),
                            format!("cannot create the job's boot region in {}: {e}", dir.display()),
                        )
                    })?;
                    let f = File::from(fd);
                    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)?;
                    reserve(&f, bytes, &name)?;
                    let map = MmapOptions::new().len(bytes).map_raw(&f)?;
                    let b = Boot { map, name: name.clone(), named: false, size, lock: f, host: None };
                    b.init(crate::region::job_hash(job));
                    // Listening only now: whoever connects gets an
                    // initialised region.
                    rustix::net::listen(&l, 1024).map_err(|e| sock_err("cannot listen on", e))?;
                    return Ok(Boot { host: Some(l), ..b });
                }
                Err(rustix::io::Errno::ADDRINUSE) => {}
                Err(e) => return Err(sock_err("cannot bind", e)),
            }
            drop(l);
            if let Some(f) = join(&addr, deadline, job, &name)? {
                let st = rustix::fs::fstat(&f)?;
                let len = st.st_size as usize;
                if st.st_mode & libc::S_IFMT != libc::S_IFREG
                    || st.st_uid != uid()
                    || st.st_mode & 0o077 != 0
                    || len < PAGE
                {
                    return Err(Error::with(
                        ErrorKind::Perm,
                        format!("job {job}: the boot region handed out on @{name} is not this user's 0600 region"),
                    ));
                }
                let map = MmapOptions::new().len(len).map_raw(&f)?;
                let b = Boot { map, name: name.clone(), named: false, size, lock: f, host: None };
                b.check(job, len)?;
                rustix::fs::flock(&b.lock, rustix::fs::FlockOperation::LockShared)?;
                return Ok(b);
            }
            if Instant::now() > deadline {
                return Err(Error::with(
                    ErrorKind::TimedOut,
                    format!("job {job}: no rank hosted the boot socket @{name} in time"),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Writes a fresh region's header (nobody has it yet) and publishes it.
    fn init(&self, job_hash: u32) {
        let h = self.map.as_mut_ptr() as *mut BootHeader;
        let pid = std::process::id();
        // SAFETY: a fresh mapping nobody else has yet (O_EXCL or O_TMPFILE),
        // magic still zero: nobody reads it yet.
        unsafe {
            std::ptr::addr_of_mut!((*h).layout_version).write(LAYOUT_VERSION);
            std::ptr::addr_of_mut!((*h).uid).write(uid());
            std::ptr::addr_of_mut!((*h).owner_pid).write(pid);
            std::ptr::addr_of_mut!((*h).owner_start_time).write(proc_start_time(pid).unwrap_or(0));
            std::ptr::addr_of_mut!((*h).layout_hash).write(LAYOUT_HASH);
            std::ptr::addr_of_mut!((*h).size).write(self.size as u32);
            std::ptr::addr_of_mut!((*h).mark).write(shm_layout::BOOT_MARK);
            std::ptr::addr_of_mut!((*h).job).write(job_hash);
        }
        // SYNC: publishes the header to the acquire in `check` (and the
        // named path's wait for initialisation).
        self.header().magic.store(MAGIC, Ordering::Release);
    }

    /// Checks a region another rank made: initialised, this build's layout
    /// (`OpNotSupp`), made for this job's size and `len` bytes long enough
    /// for it (`Inval`).
    fn check(&self, job: &str, len: usize) -> Result<()> {
        let h = self.header();
        // SYNC: pairs with the release store of magic in `init`.
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err(Error::with(
                ErrorKind::Io,
                format!("job {job}: the boot region handed out is not initialised"),
            ));
        }
        // SAFETY: published header fields (magic acquired).
        let (ver, hash, n) = unsafe {
            (
                std::ptr::addr_of!(h.layout_version).read_volatile(),
                std::ptr::addr_of!(h.layout_hash).read_volatile(),
                std::ptr::addr_of!(h.size).read_volatile() as usize,
            )
        };
        if ver != LAYOUT_VERSION || hash != LAYOUT_HASH {
            return Err(Error::with(
                ErrorKind::OpNotSupp,
                format!("job {job}: boot region has layout version {ver}, this build {LAYOUT_VERSION}: ranks built from different shmfab trees"),
            ));
        }
        if n != self.size || len < PAGE + n * std::mem::size_of::<BootEntry>() {
            return Err(Error::with(
                ErrorKind::Inval,
                format!("job {job}: its boot region is for {n} ranks but this rank was launched with {}", self.size),
            ));
        }
        Ok(())
    }

    /// Named mode: the boot region is the file `shmfab.<uid>.<jobhash>.boot`.
    fn open_named(job: &str, size: usize, deadline: Instant) -> Result<Boot> {
        let name = boot_name(job);
        check_size(size, "ranks")?;
        let bytes = PAGE + size * std::mem::size_of::<BootEntry>();
        let mut tries = 0;
        loop {
            tries += 1;
            match crate::region::open_shm(name.as_str(), true) {
                Ok(fd) => {
                    let f = File::from(fd);
                    // Locked before magic is published (see region::locked).
                    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)?;
                    // Reserve every page before writing any: a full /dev/shm
                    // is ENOSPC here, never a SIGBUS on a later store.
                    if let Err(e) = reserve(&f, bytes, &name) {
                        let _ = crate::region::unlink_shm(name.as_str());
                        return Err(e);
                    }
                    let map = MmapOptions::new().len(bytes).map_raw(&f)?;
                    let b = Boot { map, name, named: true, size, lock: f, host: None };
                    b.init(crate::region::job_hash(job));
                    return Ok(b);
                }
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => {
                    return Err(Error::with(
                        ErrorKind::from_errno(e.raw_os_error()),
                        format!("cannot create the job's boot region {}: {e}", crate::region::shm_path(&name)),
                    ))
                }
            }
            let fd = match crate::region::open_shm(name.as_str(), false) {
                Ok(fd) => fd,
                Err(rustix::io::Errno::NOENT) if tries < 100 => continue, // unlinked meanwhile
                Err(e) => {
                    return Err(Error::with(
                        ErrorKind::from_errno(e.raw_os_error()),
                        format!("{}: {e}", crate::region::shm_path(&name)),
                    ))
                }
            };
            let f = File::from(fd);
            let st = rustix::fs::fstat(&f)?;
            if st.st_uid != uid() || st.st_mode & 0o077 != 0 {
                return Err(Error::with(
                    ErrorKind::Perm,
                    format!("{} is not this user's 0600 region", crate::region::shm_path(&name)),
                ));
            }
            // Wait for its creator to size and initialise it. A creator
            // killed before it did leaves it unlocked: after a grace
            // period it is removed and made anew (by us, or another rank).
            let mut unlocked_since: Option<Instant> = None;
            let mapped = loop {
                let len = rustix::fs::fstat(&f)?.st_size as usize;
                if len >= PAGE {
                    let map = MmapOptions::new().len(len).map_raw(&f)?;
                    // SAFETY: at least one page mapped.
                    let h = unsafe { &*(map.as_ptr() as *const BootHeader) };
                    // SYNC: pairs with the release store of magic above.
                    if h.magic.load(Ordering::Acquire) == MAGIC {
                        break Some((map, len));
                    }
                }
                if crate::region::locked(&f) {
                    unlocked_since = None;
                } else if unlocked_since.get_or_insert_with(Instant::now).elapsed() > ORPHAN_GRACE {
                    unlink_if_same(&name, &f);
                    break None;
                }
                if Instant::now() > deadline {
                    return Err(Error::with(
                        ErrorKind::TimedOut,
                        format!("{} was never initialised", crate::region::shm_path(&name)),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            let Some(mapped) = mapped else {
                continue; // its creator died: start over
            };
            let (map, len) = mapped;
            let b = Boot { map, name: name.clone(), named: true, size, lock: f, host: None };
            match b.check(job, len) {
                Ok(()) => {}
                // A leftover of an earlier job with the same id, or a
                // mismatched launch.
                Err(e) if e.kind() == ErrorKind::Inval => {
                    if !crate::region::locked(&b.lock) && tries < 3 {
                        unlink_if_same(&name, &b.lock);
                        continue;
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            let n = size;
            // A stale region of a dead job of the same id with the same size:
            // its entries would name dead pids; start over.
            let stale = (0..n).any(|r| {
                let e = b.entry(r);
                e.state.load(Ordering::Acquire) == 1 && !owner_alive(e.pid, e.start_time)
            });
            if stale && !crate::region::locked(&b.lock) && tries < 3 {
                unlink_if_same(&name, &b.lock);
                continue;
            }
            rustix::fs::flock(&b.lock, rustix::fs::FlockOperation::LockShared)?;
            return Ok(b);
        }
    }
}

/// A guest's side of the anonymous boot: connects to the job's socket at
/// `addr` and receives the boot region's descriptor from its host. None
/// when nobody hosts (the caller tries to host) or the host left before
/// handing it out.
fn join(addr: &rustix::net::SocketAddrUnix, deadline: Instant, job: &str, name: &str) -> Result<Option<File>> {
    use rustix::net::{AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SocketFlags, SocketType};
    let s = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
    match rustix::net::connect(&s, addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::CONNREFUSED | rustix::io::Errno::NOENT | rustix::io::Errno::AGAIN) => return Ok(None),
        Err(e) => {
            return Err(Error::with(
                ErrorKind::from_errno(e.raw_os_error()),
                format!("job {job}: cannot connect to its boot socket @{name}: {e}"),
            ))
        }
    }
    let cred = rustix::net::sockopt::socket_peercred(&s)?;
    if cred.uid.as_raw() != uid() {
        return Err(Error::with(
            ErrorKind::Perm,
            format!(
                "job {job}: its boot socket @{name} is held by pid {} of uid {}, not this user: \
                 choose another SHMFAB_JOB_ID",
                cred.pid.as_raw_nonzero(),
                cred.uid.as_raw()
            ),
        ));
    }
    // The host hands the descriptor out from its exchange loop (every
    // millisecond or so).
    let left = deadline.saturating_duration_since(Instant::now());
    let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
    let mut p = [rustix::event::PollFd::new(&s, rustix::event::PollFlags::IN)];
    let ts = rustix::event::Timespec { tv_sec: (ms / 1000) as i64, tv_nsec: (ms % 1000) as i64 * 1_000_000 };
    if rustix::event::poll(&mut p, Some(&ts))? == 0 {
        return Err(Error::with(
            ErrorKind::TimedOut,
            format!("job {job}: the host of its boot socket @{name} never handed out the boot region"),
        ));
    }
    let mut byte = [0u8; 1];
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cm = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(&s, &mut [std::io::IoSliceMut::new(&mut byte)], &mut cm, RecvFlags::CMSG_CLOEXEC)?;
    if r.bytes == 0 {
        return Ok(None); // the host left
    }
    for m in cm.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = m {
            if let Some(fd) = fds.next() {
                return Ok(Some(File::from(fd)));
            }
        }
    }
    Ok(None)
}

/// Removes the boot region `name` if the name still refers to `f`'s file.
fn unlink_if_same(name: &str, f: &File) {
    let ours = rustix::fs::fstat(f).ok();
    let named = rustix::fs::stat(crate::region::shm_path(name)).ok();
    if let (Some(a), Some(b)) = (ours, named) {
        if a.st_dev == b.st_dev && a.st_ino == b.st_ino {
            let _ = crate::region::unlink_shm(name);
        }
    }
}

/// How long a boot region nobody holds a lock on may stay uninitialised
/// before it counts as its creator's leftover (its creator locks it right
/// after creating it, so only a dead creator leaves it so for long).
const ORPHAN_GRACE: Duration = Duration::from_millis(500);

/// Most ranks a job may have on one node: its boot region then takes
/// 4 MiB, and every size computed from it fits easily.
pub const MAX_RANKS: usize = 1 << 16;

/// Ranks an error line names before it says how many more there are.
const LISTED_RANKS: usize = 16;

/// `[1, 2, 5]`, or for a long list its first ranks and how many more:
/// `[0, 1, ..., 15] and 99984 more`, so an error stays one short line.
pub fn rank_list(ranks: &[usize]) -> String {
    let shown: Vec<String> = ranks.iter().take(LISTED_RANKS).map(|r| r.to_string()).collect();
    match ranks.len().checked_sub(LISTED_RANKS) {
        Some(more) if more > 0 => format!("[{}] and {more} more", shown.join(", ")),
        _ => format!("[{}]", shown.join(", ")),
    }
}

/// Refuses a job of more than [`MAX_RANKS`] ranks; `var` names where the
/// size came from.
fn check_size(size: usize, var: &str) -> Result<()> {
    if (1..=MAX_RANKS).contains(&size) {
        return Ok(());
    }
    Err(Error::with(ErrorKind::Inval, format!("{var}={size}: must be an integer from 1 to {MAX_RANKS}")))
}

/// The variable the launcher gave the job's size in.
fn size_var(l: Launcher) -> &'static str {
    match l {
        Launcher::Shmfab | Launcher::Single => "SHMFAB_SIZE",
        Launcher::OpenMpi => "OMPI_COMM_WORLD_SIZE",
        Launcher::Hydra => "PMI_SIZE",
        Launcher::Slurm => "SLURM_NTASKS",
    }
}

/// Allocates `bytes` of the fresh boot region `f` (which also sizes it).
/// A file system without fallocate (EOPNOTSUPP) is sized with ftruncate;
/// no space is [`ErrorKind::NoSpc`] naming the region.
fn reserve(f: &File, bytes: usize, name: &str) -> Result<()> {
    match rustix::fs::fallocate(f, rustix::fs::FallocateFlags::empty(), 0, bytes as u64) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP) => Ok(f.set_len(bytes as u64)?),
        Err(e) => Err(reserve_error(e, bytes, name)),
    }
}

/// The error of a failed reservation of the boot region.
fn reserve_error(e: rustix::io::Errno, bytes: usize, name: &str) -> Error {
    let hint = if e == rustix::io::Errno::NOSPC { ": /dev/shm is full" } else { "" };
    Error::with(
        ErrorKind::from_errno(e.raw_os_error()),
        format!("cannot reserve {bytes} bytes for the job's boot region /dev/shm/{name}: {e}{hint}"),
    )
}

/// Publishes this rank's addresses and returns every rank's (in rank order).
fn exchange(
    l: &Launch,
    addr: Address,
    ctl: Address,
    timeout: Duration,
    backing: crate::region::Backing,
) -> Result<Vec<(Address, Address)>> {
    let deadline = Instant::now() + timeout;
    let b = Boot::open(&l.job, l.size, deadline, backing)?;
    let me = b.entry(l.rank);
    let pid = std::process::id();
    if me.state.load(Ordering::Acquire) == 1 && owner_alive(me.pid, me.start_time) && me.pid != pid {
        return Err(Error::with(
            ErrorKind::Inval,
            format!("job {}: rank {} is already taken by pid {}", l.job, l.rank, me.pid),
        ));
    }
    // SAFETY: our own entry; nobody else writes it (ranks are unique).
    unsafe {
        let e = me as *const BootEntry as *mut BootEntry;
        std::ptr::addr_of_mut!((*e).pid).write_volatile(pid);
        std::ptr::addr_of_mut!((*e).start_time).write_volatile(proc_start_time(pid).unwrap_or(0));
        std::ptr::addr_of_mut!((*e).addr).write_volatile(addr);
        std::ptr::addr_of_mut!((*e).ctl).write_volatile(ctl);
    }
    // SYNC: publishes the entry to the acquire loads below in other ranks.
    me.state.store(1, Ordering::Release);
    // The last to arrive removes the name: every rank has the region open
    // and mapped by now, and a crash from here on leaves nothing behind.
    if b.header().arrived.fetch_add(1, Ordering::AcqRel) + 1 == l.size as u32 {
        b.unlink();
    }
    let r = wait_for_all(&b, l, timeout, deadline);
    if r.is_err() {
        b.abandon();
    }
    r
}

/// Waits for every rank's entry in `b` and returns them.
fn wait_for_all(b: &Boot, l: &Launch, timeout: Duration, deadline: Instant) -> Result<Vec<(Address, Address)>> {
    let mut naps = 0u32;
    loop {
        b.serve();
        let missing: Vec<usize> = (0..l.size).filter(|&r| b.entry(r).state.load(Ordering::Acquire) != 1).collect();
        if missing.is_empty() {
            break;
        }
        // Ranks that arrived and died since. Not with named regions: they
        // serve ranks in other PID namespaces, whose pids mean nothing here
        // (a rank that dies is then named at the boot timeout).
        let dead: Vec<usize> = (0..l.size)
            .filter(|&r| {
                let e = b.entry(r);
                !b.named && e.state.load(Ordering::Acquire) == 1 && !owner_alive(e.pid, e.start_time)
            })
            .collect();
        if !dead.is_empty() {
            return Err(Error::with(
                ErrorKind::Io,
                format!("job {}: rank(s) {} died while the job started", l.job, rank_list(&dead)),
            ));
        }
        if Instant::now() > deadline {
            return Err(Error::with(
                ErrorKind::TimedOut,
                format!(
                    "job {}: rank(s) {} of {} did not arrive within {:?} (SHMFAB_BOOT_TIMEOUT)",
                    l.job,
                    rank_list(&missing),
                    l.size,
                    timeout
                ),
            ));
        }
        naps += 1;
        if naps < 100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let out = (0..l.size)
        .map(|r| {
            let e = b.entry(r);
            // SAFETY: published entries (state acquired above); plain data.
            unsafe { (std::ptr::addr_of!(e.addr).read_volatile(), std::ptr::addr_of!(e.ctl).read_volatile()) }
        })
        .collect();
    b.header().departed.fetch_add(1, Ordering::AcqRel);
    Ok(out)
}

/// Tags at or above this are the World's own (barriers).
pub const RESERVED_TAGS: u64 = 0xffff_0000_0000_0000;

/// A job's ranks, connected: this rank's domain, endpoint, CQ and AV, and
/// every rank's address. A second, private endpoint carries the World's
/// barriers, so they never take the application's completions.
pub struct World {
    /// This rank.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
    /// Rank on this node.
    pub local_rank: usize,
    /// The job id.
    pub job: String,
    /// Who launched the job.
    pub launcher: Launcher,
    /// The application's endpoint (bound to `cq` and `av`).
    pub ep: Endpoint,
    /// The application's CQ (transmit and receive).
    pub cq: CompletionQueue,
    ctl_ep: Endpoint,
    ctl_cq: CompletionQueue,
    /// The address vector; `addr(r)` is rank r's entry.
    pub av: AddressVector,
    /// The domain.
    pub dom: Domain,
    _fabric: Fabric,
    addrs: Vec<FiAddr>,
    ctl_addrs: Vec<FiAddr>,
    epoch: Cell<u64>,
    /// Completions read by `wait` that were not the one asked for.
    pending: RefCell<Vec<std::result::Result<CqTaggedEntry, CqErrEntry>>>,
}

impl World {
    /// Joins the job the launcher started: opens the domain and endpoints,
    /// exchanges addresses with every rank, then a barrier.
    pub fn init() -> Result<World> {
        let l = Launch::detect().map_err(|e| Error::with(ErrorKind::Inval, e.0))?;
        check_size(l.size, size_var(l.launcher))?;
        let fabric = Fabric::open()?;
        let timeout = fabric.config().boot_timeout;
        let dom = fabric.domain()?;
        let cq = dom.cq_open(&CqAttr { size: 16384, ..Default::default() })?;
        let ctl_cq = dom.cq_open(&CqAttr { size: 1024, ..Default::default() })?;
        let av = dom.av_open()?;
        let ep = dom.endpoint()?;
        let ctl_ep = dom.endpoint()?;
        for (e, c) in [(&ep, &cq), (&ctl_ep, &ctl_cq)] {
            e.bind_cq(c, FI_TRANSMIT | FI_RECV)?;
            e.bind_av(&av)?;
            e.enable()?;
        }
        let all = exchange(&l, ep.getname(), ctl_ep.getname(), timeout, fabric.config().regions)?;
        let addrs = av.insert(&all.iter().map(|a| a.0).collect::<Vec<_>>())?;
        let ctl_addrs = av.insert(&all.iter().map(|a| a.1).collect::<Vec<_>>())?;
        // The barrier endpoint is driven only inside barriers.
        ctl_ep.set_passive(true)?;
        let w = World {
            rank: l.rank,
            size: l.size,
            local_rank: l.local_rank,
            job: l.job,
            launcher: l.launcher,
            ep,
            cq,
            ctl_ep,
            ctl_cq,
            av,
            dom,
            _fabric: fabric,
            addrs,
            ctl_addrs,
            epoch: Cell::new(0),
            pending: RefCell::new(Vec::new()),
        };
        w.barrier()?;
        Ok(w)
    }

    /// Rank `r`'s fi_addr in [`World::av`].
    pub fn addr(&self, r: usize) -> FiAddr {
        self.addrs[r]
    }

    /// The rank behind an fi_addr (a source from `readfrom`).
    pub fn rank_of(&self, a: FiAddr) -> Option<usize> {
        self.addrs.iter().position(|&x| x == a)
    }

    /// A barrier over the control endpoint (dissemination: log2(size)
    /// rounds of one message each way).
    pub fn barrier(&self) -> Result<()> {
        let n = self.size;
        if n == 1 {
            return Ok(());
        }
        let epoch = self.epoch.get();
        self.epoch.set(epoch + 1);
        self.ctl_ep.set_passive(false)?;
        let r = self.barrier_rounds(epoch);
        // Passive again whatever happened: its messages of later barriers
        // wait in its rings.
        self.ctl_ep.set_passive(true)?;
        r
    }

    /// The rounds of barrier `epoch` (the control endpoint active).
    fn barrier_rounds(&self, epoch: u64) -> Result<()> {
        let n = self.size;
        let mut d = 1;
        let mut round = 0u64;
        let mut b = [0u8; 1];
        while d < n {
            let to = (self.rank + d) % n;
            let from = (self.rank + n - d) % n;
            let tag = RESERVED_TAGS | ((epoch & 0xffff_ffff) << 8) | round;
            // SAFETY: b lives until the completion waited for below.
            unsafe { self.ctl_ep.trecv(&mut b, self.ctl_addrs[from], tag, 0, 1)? };
            loop {
                match self.ctl_ep.tinject(&[1], self.ctl_addrs[to], tag) {
                    Ok(()) => break,
                    Err(e) if e.kind() == ErrorKind::Again => self.dom.progress()?,
                    Err(e) => return Err(e),
                }
            }
            if let Err(e) = wait_one(&self.dom, &self.ctl_cq, &RefCell::new(Vec::new()), 1, None)? {
                let text = self.ctl_cq.last_error_text().unwrap_or_default();
                return Err(Error::with(
                    ErrorKind::from_errno(e.err),
                    format!("barrier round {round} with rank {from}: {text}"),
                ));
            }
            d *= 2;
            round += 1;
        }
        Ok(())
    }

    /// The completion of the operation with context `ctx` on the
    /// application CQ, driving progress and sleeping on the doorbell
    /// between tries (so oversubscribed ranks do not burn the cores).
    /// Completions of other operations read meanwhile are kept for later
    /// calls. Err(entry) for an error completion. `timeout`: `None` waits
    /// forever, `Some(d)` at most `d` (`Some(Duration::ZERO)`: one try);
    /// on timeout `-FI_EAGAIN`, and the operation stays pending: a later
    /// `wait` for `ctx` still gets its completion.
    pub fn wait(
        &self,
        ctx: usize,
        timeout: Option<Duration>,
    ) -> Result<std::result::Result<CqTaggedEntry, CqErrEntry>> {
        wait_one(&self.dom, &self.cq, &self.pending, ctx, timeout)
    }
}

type Entry = std::result::Result<CqTaggedEntry, CqErrEntry>;

fn wait_one(
    dom: &Domain,
    cq: &CompletionQueue,
    pending: &RefCell<Vec<Entry>>,
    ctx: usize,
    timeout: Option<Duration>,
) -> Result<Entry> {
    let ctx_of = |r: &Entry| match r {
        Ok(e) => e.op_context,
        Err(e) => e.op_context,
    };
    let found = pending.borrow().iter().position(|r| ctx_of(r) == ctx);
    if let Some(i) = found {
        return Ok(pending.borrow_mut().remove(i));
    }
    let deadline = crate::domain::deadline(timeout);
    let mut spins = 0u32;
    loop {
        let mut e = [CqTaggedEntry::default()];
        let r = match cq.read(&mut e) {
            Ok(_) => Some(Ok(e[0])),
            Err(x) if x.kind() == ErrorKind::Avail => Some(Err(cq.readerr()?)),
            Err(x) if x.kind() == ErrorKind::Again => None,
            Err(x) => return Err(x),
        };
        match r {
            Some(r) if ctx_of(&r) == ctx => return Ok(r),
            Some(r) => pending.borrow_mut().push(r),
            None => {
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                if left.is_some_and(|l| l.is_zero()) {
                    return Err(Error::with(
                        ErrorKind::Again,
                        format!("no completion for context {ctx:#x} within {:?}", timeout.unwrap_or_default()),
                    ));
                }
                spins += 1;
                if spins > 64 {
                    dom.wait(Some(left.map_or(Duration::from_millis(1), |l| l.min(Duration::from_millis(1)))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::Backing;

    #[test]
    fn a_rank_that_never_arrives_is_named() {
        let job = format!("unit-boot-{}", std::process::id());
        let l = Launch { rank: 0, size: 3, local_rank: 0, job: job.clone(), launcher: Launcher::Shmfab };
        let a = Address::default();
        for backing in [Backing::Anonymous, Backing::Named] {
            let e = exchange(&l, a, a, Duration::from_millis(200), backing).unwrap_err();
            let s = e.to_string();
            assert_eq!(e.kind(), ErrorKind::TimedOut);
            assert!(s.contains("[1, 2]") && s.contains("did not arrive"), "{s}");
            // The last rank to leave a failed exchange removes the region.
            assert!(!std::path::Path::new(&format!("/dev/shm/{}", boot_name(&job))).exists(), "left behind");
        }
    }

    #[test]
    fn a_boot_region_whose_creator_died_before_initialising_it_is_replaced() {
        // Was: the other ranks waited for it until the boot timeout, then
        // failed and left it in /dev/shm (2 of 200 kill -9 trials).
        let job = format!("unit-boot-orphan-{}", std::process::id());
        let name = boot_name(&job);
        let f = File::from(crate::region::open_shm(&name, true).unwrap());
        drop(f); // created, never locked nor initialised: its creator died
        let l = Launch { rank: 0, size: 1, local_rank: 0, job: job.clone(), launcher: Launcher::Shmfab };
        let a = Address { ep_index: 3, ..Default::default() };
        let out = exchange(&l, a, a, Duration::from_secs(10), Backing::Named);
        let _ = crate::region::unlink_shm(&name);
        assert_eq!(out.unwrap(), vec![(a, a)]);
        assert!(!std::path::Path::new(&format!("/dev/shm/{name}")).exists());
    }

    #[test]
    fn single_rank_exchange_unlinks_its_boot_region() {
        let job = format!("unit-boot1-{}", std::process::id());
        let l = Launch { rank: 0, size: 1, local_rank: 0, job: job.clone(), launcher: Launcher::Shmfab };
        let a = Address { ep_index: 3, ..Default::default() };
        for backing in [Backing::Anonymous, Backing::Named] {
            let out = exchange(&l, a, a, Duration::from_secs(5), backing).unwrap();
            assert_eq!(out, vec![(a, a)]);
            assert!(!std::path::Path::new(&format!("/dev/shm/{}", boot_name(&job))).exists());
            assert!(socket_free(&job), "the boot socket outlived the exchange");
        }
    }

    /// Whether nobody holds the job's boot socket (binding it works).
    fn socket_free(job: &str) -> bool {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
        let addr = SocketAddrUnix::new_abstract_name(boot_name(job).as_bytes()).unwrap();
        let s =
            rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        rustix::net::bind(&s, &addr).is_ok()
    }

    #[test]
    fn ranks_meet_on_the_jobs_socket_and_leave_nothing() {
        // Three ranks as threads: the first to bind hosts, the others get
        // the anonymous region through the socket.
        let job = format!("unit-boot-sock-{}", std::process::id());
        let addrs: Vec<Address> = (0..3).map(|r| Address { ep_index: r, pid: 7, ..Default::default() }).collect();
        let outs: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|r| {
                    let (job, a) = (job.clone(), addrs[r]);
                    s.spawn(move || {
                        let l = Launch { rank: r, size: 3, local_rank: r, job, launcher: Launcher::Shmfab };
                        exchange(&l, a, a, Duration::from_secs(20), Backing::Anonymous)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for o in outs {
            assert_eq!(o.unwrap(), addrs.iter().map(|&a| (a, a)).collect::<Vec<_>>());
        }
        assert!(!std::path::Path::new(&format!("/dev/shm/{}", boot_name(&job))).exists());
        assert!(socket_free(&job));
        assert!(crate::region::scan(Some(crate::region::job_hash(&job))).is_empty());
    }

    #[test]
    fn a_boot_host_that_leaves_is_replaced_by_the_next_rank() {
        let job = format!("unit-boot-host-{}", std::process::id());
        let deadline = Instant::now() + Duration::from_secs(5);
        let b = Boot::open(&job, 2, deadline, Backing::Anonymous).unwrap();
        assert!(b.host.is_some(), "the first rank hosts");
        // A starting job's anonymous boot region is found (shmfab inspect).
        let found = crate::region::scan(Some(crate::region::job_hash(&job)));
        assert!(found.len() == 1 && found[0].alive && !found[0].named && found[0].name == boot_name(&job), "{found:?}");
        let snap = crate::snapshot::boot(&found[0].id.path()).unwrap();
        assert_eq!((snap.size, snap.arrived), (2, 0));
        // The second joins: it gets the region while the host serves.
        let b2 = std::thread::scope(|s| {
            let h = s.spawn(|| Boot::open(&job, 2, deadline, Backing::Anonymous));
            while !h.is_finished() {
                b.serve();
                std::thread::sleep(Duration::from_millis(1));
            }
            h.join().unwrap().unwrap()
        });
        assert!(b2.host.is_none(), "the second joins");
        let (a, c) = (rustix::fs::fstat(&b.lock).unwrap(), rustix::fs::fstat(&b2.lock).unwrap());
        assert_eq!((a.st_dev, a.st_ino), (c.st_dev, c.st_ino), "one region");
        drop(b2);
        drop(b);
        // The host died before anyone else came: the next rank hosts anew.
        let b3 = Boot::open(&job, 2, deadline, Backing::Anonymous).unwrap();
        assert!(b3.host.is_some());
        // A rank launched with another size is refused by the host's region.
        let e = std::thread::scope(|s| {
            let h = s.spawn(|| Boot::open(&job, 3, deadline, Backing::Anonymous));
            while !h.is_finished() {
                b3.serve();
                std::thread::sleep(Duration::from_millis(1));
            }
            h.join().unwrap().err().unwrap()
        });
        assert!(e.to_string().contains("is for 2 ranks"), "{e}");
    }

    #[test]
    fn rank_lists_in_errors_are_bounded() {
        assert_eq!(rank_list(&[]), "[]");
        assert_eq!(rank_list(&[1, 2]), "[1, 2]");
        assert_eq!(rank_list(&(0..16).collect::<Vec<_>>()), format!("{:?}", (0..16).collect::<Vec<_>>()));
        let all: Vec<usize> = (0..100_000).collect();
        let s = rank_list(&all);
        assert_eq!(s, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] and 99984 more");
    }

    #[test]
    fn many_ranks_that_never_arrive_make_one_short_line() {
        // Was: every missing rank listed (689,018 characters for 100,000).
        let job = format!("unit-boot-many-{}", std::process::id());
        let l = Launch { rank: 0, size: 5000, local_rank: 0, job: job.clone(), launcher: Launcher::Shmfab };
        let a = Address::default();
        let e = exchange(&l, a, a, Duration::from_millis(200), Backing::Anonymous).unwrap_err();
        let s = e.to_string();
        assert_eq!(e.kind(), ErrorKind::TimedOut);
        assert!(s.contains("[1, 2, 3,") && s.contains("and 4983 more of 5000 did not arrive"), "{s}");
        assert!(s.len() < 300 && !s.contains('\n'), "{} characters: {s}", s.len());
    }

    #[test]
    fn a_job_too_large_for_one_node_is_refused_before_any_memory_is_touched() {
        // Was: PAGE + size * 64 wrapped, the mapping was too small: SIGSEGV.
        let e = check_size(288230376151711745, "SHMFAB_SIZE").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Inval);
        assert_eq!(e.detail(), Some("SHMFAB_SIZE=288230376151711745: must be an integer from 1 to 65536"));
        assert!(check_size(0, "PMI_SIZE").is_err());
        assert!(check_size(MAX_RANKS, "PMI_SIZE").is_ok());
        let job = format!("unit-boot-huge-{}", std::process::id());
        for backing in [Backing::Anonymous, Backing::Named] {
            let e = Boot::open(&job, usize::MAX / 32, Instant::now(), backing).err().unwrap();
            assert_eq!(e.kind(), ErrorKind::Inval);
        }
        assert!(!std::path::Path::new(&format!("/dev/shm/{}", boot_name(&job))).exists());
        assert_eq!(size_var(Launcher::OpenMpi), "OMPI_COMM_WORLD_SIZE");
    }

    #[test]
    fn the_boot_region_is_reserved_before_it_is_written() {
        // Was: ftruncate only (a sparse file): a full /dev/shm was a SIGBUS
        // at the first store into a page the kernel could not supply.
        let job = format!("unit-boot-reserve-{}", std::process::id());
        let size = 1000;
        let anon = Boot::open(&job, size, Instant::now() + Duration::from_secs(5), Backing::Anonymous).unwrap();
        let st = rustix::fs::fstat(&anon.lock).unwrap();
        let bytes = PAGE + size * std::mem::size_of::<BootEntry>();
        assert!(st.st_blocks as usize * 512 >= bytes, "{} of {bytes} bytes allocated", st.st_blocks * 512);
        drop(anon);
        let b = Boot::open(&job, size, Instant::now() + Duration::from_secs(5), Backing::Named).unwrap();
        let path = format!("/dev/shm/{}", boot_name(&job));
        let st = rustix::fs::stat(path.as_str()).unwrap();
        let _ = rustix::shm::unlink(boot_name(&job).as_str());
        drop(b);
        let bytes = PAGE + size * std::mem::size_of::<BootEntry>();
        assert_eq!(st.st_size as usize, bytes);
        assert!(st.st_blocks as usize * 512 >= bytes, "{} of {bytes} bytes allocated", st.st_blocks * 512);
        // No space is ENOSPC, naming the region and why.
        let e = reserve_error(rustix::io::Errno::NOSPC, bytes, "shmfab.0.x.boot");
        assert_eq!(e.kind(), ErrorKind::NoSpc);
        let d = e.detail().unwrap();
        assert!(d.contains("/dev/shm/shmfab.0.x.boot") && d.contains("/dev/shm is full"), "{d}");
        assert_eq!(reserve_error(rustix::io::Errno::IO, 1, "b").kind(), ErrorKind::Io);
    }

    #[test]
    fn a_boot_region_is_alive_while_a_rank_is_in_it_whatever_pid_it_names() {
        // Its creator in another PID namespace: the pid means nothing here.
        let job = format!("unit-boot-lock-{}", std::process::id());
        let b = Boot::open(&job, 2, Instant::now() + Duration::from_secs(5), Backing::Named).unwrap();
        let h = b.map.as_mut_ptr() as *mut BootHeader;
        // SAFETY: our own boot region; only this test touches it.
        unsafe { std::ptr::addr_of_mut!((*h).owner_pid).write(0x3fff_fff0) };
        let jh = crate::region::job_hash(&job);
        let alive = |name: &str| crate::region::scan(Some(jh)).iter().find(|r| r.name == name).map(|r| r.alive);
        assert_eq!(alive(&b.name), Some(true));
        assert!(crate::region::clean_dead(true).iter().all(|r| r.name != b.name));
        // A second rank opening it finds it in use and joins it.
        let b2 = Boot::open(&job, 2, Instant::now() + Duration::from_secs(5), Backing::Named).unwrap();
        let name = b.name.clone();
        drop(b);
        assert_eq!(alive(&name), Some(true), "the second rank is still in it");
        drop(b2);
        // Dead, or already removed by a clean of another test's domain.
        assert_ne!(alive(&name), Some(true), "nobody in it: a leftover");
        let _ = crate::region::unlink_shm(name.as_str());
    }
}
