//! Shared-memory regions: one per domain.
//!
//! **Anonymous by default** (`SHMFAB_REGIONS=anonymous`): a region is a file
//! with no name, made with `O_TMPFILE` in /dev/shm (or `SHMFAB_SHM_DIR`; where
//! the file system has no `O_TMPFILE` it is created with a name and unlinked
//! at once). Peers open it through its owner, as `/proc/<pid>/fd/<fd>` (the
//! pid and descriptor are in every address), and check that the header
//! carries the address's job and token. The kernel frees it when the last
//! process holding it exits, whatever killed them: a job leaves nothing
//! behind, with no cleaner. `shmfab inspect` finds these regions through
//! the descriptors of live processes (`/proc/*/fd`).
//!
//! **Named** (`SHMFAB_REGIONS=named`): for ranks in different PID
//! namespaces, which cannot reach each other's `/proc/<pid>`. A region is
//! created `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600, named
//! `shmfab.<uid>.<jobhash>.<token>` (`shm_open`, or plain `open` in
//! `SHMFAB_SHM_DIR`); it is unlinked when its owner closes it, and after a
//! crash by [`clean_dead`] (the next domain creation, or `shmfab clean`).
//!
//! Either way peers check magic, layout version and hash, owner uid, mode
//! and sizes before using a region.
//!
//! **Liveness**: the owner holds an exclusive `flock` on its region file
//! from before it publishes the header until it dies or closes the region;
//! the kernel drops it when the process exits, whatever killed it. A
//! region is alive while its owner holds that lock ([`owner_locked`]: a
//! non-blocking shared lock taken on a descriptor of our own fails, which
//! another process probing at the same instant, with a shared lock too,
//! cannot make it do). This
//! holds across PID namespaces, where the pid and start time in the header
//! mean nothing, and a zombie owner holds no lock. The header's pid and
//! start time only name the owner in messages, and keep alive the region
//! of a build that took no lock while its owner lives (a pid can only make
//! a region alive, never dead).
//!
//! ```
//! use shmfab::internal::region::{job_hash, region_name};
//! let n = region_name(1000, job_hash("job-7"), 0xabc);
//! assert!(n.starts_with("shmfab.1000."));
//! ```

use crate::error::{Error, ErrorKind, Result};
use memmap2::{MmapOptions, MmapRaw};
use shm_layout::{region_size, state, Address, EpGeometry, RegionHeader, LAYOUT_HASH, LAYOUT_VERSION, MAGIC, PAGE};
use std::fs::File;
use std::sync::atomic::Ordering;

// The job and process identity (a leaf module) are re-exported here for
// the domain, which names its region after the job, and for the liveness
// checks of peers' regions.
pub use crate::job::{job_id, owner_alive, proc_start_time};

/// Where POSIX shared memory lives on Linux: the default directory.
pub const SHM_DIR: &str = "/dev/shm";
/// The variable that names another directory for regions.
pub const SHM_DIR_VAR: &str = "SHMFAB_SHM_DIR";

/// The directory `value` of [`SHM_DIR_VAR`] names, checked: an absolute
/// path to an existing, writable directory.
pub fn check_dir(value: &str) -> Result<std::path::PathBuf> {
    let bad = |why: String| Error::with(ErrorKind::Inval, format!("{SHM_DIR_VAR}={value:?}: {why}"));
    let p = std::path::PathBuf::from(value);
    if !p.is_absolute() {
        return Err(bad("not an absolute path (every rank must name the same directory)".into()));
    }
    match std::fs::metadata(&p) {
        Err(e) => return Err(bad(format!("cannot use it: {e}"))),
        Ok(m) if !m.is_dir() => return Err(bad("not a directory".into())),
        Ok(_) => {}
    }
    rustix::fs::access(&p, rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK)
        .map_err(|e| bad(format!("not writable: {e}")))?;
    Ok(p)
}

/// The directory set by [`SHM_DIR_VAR`], unchecked (None: /dev/shm
/// through `shm_open`).
fn dir_setting() -> Option<std::path::PathBuf> {
    std::env::var_os(SHM_DIR_VAR).filter(|v| !v.is_empty()).map(std::path::PathBuf::from)
}

/// The directory regions live in: [`SHM_DIR_VAR`] if set (checked, an
/// error naming the variable otherwise), else [`SHM_DIR`].
pub fn shm_dir() -> Result<std::path::PathBuf> {
    match std::env::var(SHM_DIR_VAR) {
        Ok(v) if !v.is_empty() => check_dir(&v),
        Err(std::env::VarError::NotUnicode(v)) => {
            Err(Error::with(ErrorKind::Inval, format!("{SHM_DIR_VAR}={v:?}: not a valid path")))
        }
        _ => Ok(std::path::PathBuf::from(SHM_DIR)),
    }
}

/// Opens the region file `name` read-write, creating it (exclusively, mode
/// 0600) if `create`; never follows a symlink. `shm_open` by default, plain
/// `open` in the [`SHM_DIR_VAR`] directory if set.
pub fn open_shm(name: &str, create: bool) -> rustix::io::Result<rustix::fd::OwnedFd> {
    let mode = rustix::fs::Mode::from_raw_mode(0o600);
    match dir_setting() {
        None => {
            let mut fl = rustix::shm::OFlags::RDWR | rustix::shm::OFlags::from_bits_retain(libc::O_NOFOLLOW as u32);
            if create {
                fl |= rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL;
            }
            rustix::shm::open(name, fl, mode)
        }
        Some(dir) => {
            use rustix::fs::OFlags;
            let mut fl = OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            if create {
                fl |= OFlags::CREATE | OFlags::EXCL;
            }
            rustix::fs::open(dir.join(name), fl, mode)
        }
    }
}

/// Removes the region file `name` (from where [`open_shm`] opens it).
pub fn unlink_shm(name: &str) -> rustix::io::Result<()> {
    match dir_setting() {
        None => rustix::shm::unlink(name),
        Some(dir) => rustix::fs::unlink(dir.join(name)),
    }
}
/// Prefix of every region name.
pub const PREFIX: &str = "shmfab.";

/// This process's real user id.
pub fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// FNV-1a hash of a job id, as kept in names and headers.
pub fn job_hash(job: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in job.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The name of a region: its file name when named, and how messages and
/// the tools call it either way.
pub fn region_name(uid: u32, job: u32, token: u32) -> String {
    format!("{PREFIX}{uid}.{job:08x}.{token:08x}")
}

/// How a domain keeps its region (`SHMFAB_REGIONS`); see the module's doc.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backing {
    /// No name: reached through the owner's `/proc/<pid>/fd/<fd>`, freed by
    /// the kernel when the last process holding it exits (the default).
    #[default]
    Anonymous,
    /// A name in the shared memory directory, for ranks in different PID
    /// namespaces; a crashed owner's region stays until [`clean_dead`].
    Named,
}

/// Which region an address is in, and how to reach it: the region part of
/// an [`Address`]. Equal for every endpoint of one region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegionId {
    /// The owner's pid (for an anonymous region, a holder's pid).
    pub pid: u32,
    /// The holder's descriptor, or [`Address::NAMED`].
    pub fd: u32,
    /// Job hash.
    pub job: u32,
    /// Token.
    pub token: u32,
}

impl RegionId {
    /// The region part of `a`.
    pub fn of(a: &Address) -> RegionId {
        RegionId { pid: a.pid, fd: a.fd, job: a.job, token: a.token }
    }

    /// The id of the named region `name` (`shmfab.<uid>.<job>.<token>`).
    pub fn from_name(name: &str) -> Option<RegionId> {
        let rest = name.strip_prefix(PREFIX)?;
        let mut parts = rest.split('.');
        let _uid: u32 = parts.next()?.parse().ok()?;
        let job = u32::from_str_radix(parts.next()?, 16).ok()?;
        let token = u32::from_str_radix(parts.next()?, 16).ok()?;
        parts.next().is_none().then_some(RegionId { pid: 0, fd: Address::NAMED, job, token })
    }

    /// Whether the region has a name in the shared memory directory.
    pub fn named(&self) -> bool {
        self.fd == Address::NAMED
    }

    /// The region's name (see [`region_name`]; regions are this user's).
    pub fn name(&self) -> String {
        region_name(uid(), self.job, self.token)
    }

    /// Where it is opened: `/proc/<pid>/fd/<fd>`, or its file.
    pub fn path(&self) -> String {
        if self.named() {
            shm_path(&self.name())
        } else {
            format!("/proc/{}/fd/{}", self.pid, self.fd)
        }
    }
}

/// The peer regions a domain has mapped, by identity.
pub type RegionMap = std::collections::HashMap<RegionId, std::sync::Arc<Region>>;

/// A mapped region: ours (unlinked on drop when named) or a peer's.
pub struct Region {
    map: MmapRaw,
    name: String,
    owned: bool,
    /// How a peer reaches it (our pid and descriptor, or its name).
    id: RegionId,
    /// Keeps the fd open for the life of the mapping (fallocate on open;
    /// for our anonymous region, the descriptor peers open through /proc).
    file: File,
}

// SAFETY: the mapping is plain shared memory; all access to it goes through
// atomics or raw-pointer copies whose races the protocols account for.
unsafe impl Send for Region {}
// SAFETY: as above; `Region` hands out raw pointers only.
unsafe impl Sync for Region {}

/// Where the region file `name` is (for messages and the tools).
pub fn shm_path(name: &str) -> String {
    format!("{}/{name}", dir_setting().as_deref().unwrap_or(std::path::Path::new(SHM_DIR)).display())
}

fn space_hint(e: &Error) -> Error {
    let dir = dir_setting().unwrap_or_else(|| SHM_DIR.into());
    let dir = dir.display();
    match e.kind() {
        ErrorKind::NoSpc | ErrorKind::NoMem => Error::with(
            e.kind(),
            format!(
                "{e}: {dir} is too small or full; free space with `shmfab clean` (named regions of dead jobs) \
                 or enlarge it (mount -o remount,size=... {dir})"
            ),
        ),
        ErrorKind::Perm => {
            Error::with(e.kind(), format!("{e}: {dir} refused access; check its mount options and permissions"))
        }
        _ => e.clone(),
    }
}

impl Region {
    /// Creates and initialises a new region for this process.
    pub fn create(job: u32, g: &EpGeometry, n_eps: u32, n_counters: u32, backing: Backing) -> Result<Region> {
        g.validate().map_err(|m| Error::with(ErrorKind::Inval, format!("bad geometry: {m}")))?;
        if n_eps == 0 || n_eps > 256 || n_counters > 4096 {
            return Err(Error::with(ErrorKind::Inval, "n_eps must be 1..=256 and n_counters at most 4096"));
        }
        let dir = shm_dir()?;
        let uid = uid();
        let size = region_size(g, n_eps, n_counters);
        let mut tries = 0;
        let (name, token, fd) = loop {
            let token: u32 = rand::random::<u32>() | 1;
            let name = region_name(uid, job, token);
            let made = match backing {
                Backing::Named => open_shm(name.as_str(), true),
                Backing::Anonymous => create_anonymous(&dir, &name),
            };
            match made {
                Ok(fd) => break (name, token, fd),
                Err(rustix::io::Errno::EXIST) if tries < 8 => tries += 1,
                Err(e) => {
                    return Err(space_hint(&Error::with(
                        ErrorKind::from_errno(e.raw_os_error()),
                        format!("cannot create {}: {e}", shm_path(&name)),
                    )))
                }
            }
        };
        let file = File::from(fd);
        let named = backing == Backing::Named;
        let cleanup = |e: Error| {
            if named {
                let _ = unlink_shm(name.as_str());
            }
            space_hint(&e)
        };
        // The owner's lock, held until the file is closed (on drop, or by
        // the kernel when we die); taken before the header is published,
        // so a region with magic set and no lock has a dead owner. Blocking:
        // a scan may hold a shared lock for an instant (`owner_locked`).
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
            cleanup(Error::with(
                ErrorKind::from_errno(e.raw_os_error()),
                format!("cannot lock {}: {e}", shm_path(&name)),
            ))
        })?;
        file.set_len(size as u64).map_err(|e| cleanup(Error::from(e)))?;
        // Reserve the header and counter pages now, so a full /dev/shm is an
        // error here rather than a SIGBUS later; endpoint sections are
        // reserved when each endpoint opens (`reserve`).
        let eps_off = shm_layout::eps_offset(n_counters);
        fallocate(&file, 0, eps_off).map_err(cleanup)?;
        let map = MmapOptions::new().len(size).map_raw(&file).map_err(|e| cleanup(Error::from(e)))?;
        let pid = std::process::id();
        let fd = if named { Address::NAMED } else { std::os::fd::AsRawFd::as_raw_fd(&file) as u32 };
        let id = RegionId { pid, fd, job, token };
        let r = Region { map, name, owned: true, id, file };
        let start = proc_start_time(pid).unwrap_or(0);
        // SAFETY: the mapping is at least one page, page aligned, and nobody
        // else has it yet (a fresh file: no name, or a fresh one, O_EXCL);
        // magic is still zero so no peer will read the header before we
        // store it below.
        unsafe {
            let h = r.map.as_mut_ptr() as *mut RegionHeader;
            std::ptr::addr_of_mut!((*h).layout_version).write(LAYOUT_VERSION);
            std::ptr::addr_of_mut!((*h).uid).write(uid);
            std::ptr::addr_of_mut!((*h).owner_pid).write(pid);
            std::ptr::addr_of_mut!((*h).owner_start_time).write(start);
            std::ptr::addr_of_mut!((*h).layout_hash).write(LAYOUT_HASH);
            std::ptr::addr_of_mut!((*h).total_size).write(size as u64);
            std::ptr::addr_of_mut!((*h).job).write(job);
            std::ptr::addr_of_mut!((*h).n_eps).write(n_eps);
            std::ptr::addr_of_mut!((*h).n_counters).write(n_counters);
            std::ptr::addr_of_mut!((*h).token).write(token);
            std::ptr::addr_of_mut!((*h).pid_ns).write(crate::job::pid_ns());
            std::ptr::addr_of_mut!((*h).geometry).write(*g);
        }
        // Relaxed: published by the release store of magic below.
        r.header().state.store(state::READY, Ordering::Relaxed);
        // SYNC: publishes the header to the acquire load of magic in attach().
        r.header().magic.store(MAGIC, Ordering::Release);
        Ok(r)
    }

    /// Maps a peer's region (the region part of its address) and checks
    /// everything a peer controls, including that its header carries the
    /// address's job and token.
    pub fn attach(id: &RegionId) -> Result<Region> {
        let dir = shm_dir()?;
        let name = id.name();
        let file = if id.named() {
            let fd = open_shm(name.as_str(), false).map_err(|e| {
                let kind = match e {
                    rustix::io::Errno::NOENT => ErrorKind::AddrNotAvail,
                    _ => ErrorKind::from_errno(e.raw_os_error()),
                };
                Error::with(kind, format!("cannot open peer region {}: {e}", shm_path(&name)))
            })?;
            File::from(fd)
        } else {
            open_anonymous(id, &dir)?
        };
        let r = Region::check(file, name, id)?;
        let h = r.header();
        // SAFETY: header fields published before magic (checked in `check`).
        let (job, token) =
            unsafe { (std::ptr::addr_of!(h.job).read_volatile(), std::ptr::addr_of!(h.token).read_volatile()) };
        if job != id.job || token != id.token {
            return Err(Error::with(
                ErrorKind::AddrNotAvail,
                format!(
                    "{} is region {} of another owner: region {} is gone (its owner exited and the \
                     descriptor was reused)",
                    id.path(),
                    region_name(uid(), job, token),
                    id.name()
                ),
            ));
        }
        Ok(r)
    }

    /// The checks of a region file opened for reading: owner uid, mode,
    /// size, magic, layout, geometry.
    fn check(file: File, name: String, id: &RegionId) -> Result<Region> {
        let st = rustix::fs::fstat(&file)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Error::with(ErrorKind::Inval, format!("{} is not a regular file", id.path())));
        }
        let me = uid();
        if st.st_uid != me {
            return Err(Error::with(
                ErrorKind::Perm,
                format!(
                    "region {name} belongs to uid {} but this process runs as uid {me}: \
                     shmfab only talks to its own user's regions",
                    st.st_uid
                ),
            ));
        }
        if st.st_mode & 0o077 != 0 {
            return Err(Error::with(
                ErrorKind::Perm,
                format!("region {name} has mode {:o}; shmfab regions are 0600", st.st_mode & 0o777),
            ));
        }
        let fsize = st.st_size as usize;
        if fsize < PAGE {
            return Err(Error::with(ErrorKind::Io, format!("region {name} is too short ({fsize} bytes)")));
        }
        let map = MmapOptions::new().len(fsize).map_raw(&file)?;
        let r = Region { map, name, owned: false, id: *id, file };
        let name = r.name.as_str();
        let h = r.header();
        // SYNC: pairs with the release store of magic in create().
        let magic = h.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(Error::with(
                ErrorKind::AddrNotAvail,
                format!("region {name} is not initialised (magic {magic:#x})"),
            ));
        }
        // SAFETY: the header page is mapped (fsize >= PAGE) and these plain
        // fields were published before magic; volatile because a peer wrote them.
        let (ver, hash, ruid) = unsafe {
            (
                std::ptr::addr_of!(h.layout_version).read_volatile(),
                std::ptr::addr_of!(h.layout_hash).read_volatile(),
                std::ptr::addr_of!(h.uid).read_volatile(),
            )
        };
        if ver != LAYOUT_VERSION || hash != LAYOUT_HASH {
            return Err(Error::with(
                ErrorKind::OpNotSupp,
                format!(
                    "region {name} has layout version {ver} (hash {hash:#018x}) but this build \
                     has layout version {LAYOUT_VERSION} (hash {LAYOUT_HASH:#018x}): the peer was \
                     built from another shmfab; rebuild both sides from one tree"
                ),
            ));
        }
        if ruid != me {
            return Err(Error::with(
                ErrorKind::Perm,
                format!("region {name} says uid {ruid} but this process runs as uid {me}"),
            ));
        }
        // SAFETY: as above: published header fields, read once.
        let (total, g, n_eps, n_counters) = unsafe {
            (
                std::ptr::addr_of!(h.total_size).read_volatile(),
                std::ptr::addr_of!(h.geometry).read_volatile(),
                std::ptr::addr_of!(h.n_eps).read_volatile(),
                std::ptr::addr_of!(h.n_counters).read_volatile(),
            )
        };
        g.validate().map_err(|m| Error::with(ErrorKind::Io, format!("region {name}: bad geometry: {m}")))?;
        if n_eps == 0 || n_eps > 256 || n_counters > 4096 {
            return Err(Error::with(ErrorKind::Io, format!("region {name}: bad endpoint or counter count")));
        }
        let want = region_size(&g, n_eps, n_counters);
        if total as usize != fsize || want != fsize {
            return Err(Error::with(
                ErrorKind::Io,
                format!("region {name}: size {fsize} does not match its header ({total}, computed {want})"),
            ));
        }
        Ok(r)
    }

    /// Reserves (allocates) `len` bytes at `off`: first touch by the caller,
    /// and ENOSPC now rather than SIGBUS later.
    pub fn reserve(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(Error::with(ErrorKind::Inval, "reserve out of range"));
        }
        fallocate(&self.file, off, len).map_err(|e| space_hint(&e))
    }

    /// The file behind the mapping.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The region's name (its file in /dev/shm or `SHMFAB_SHM_DIR` when
    /// named; how messages call it either way).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How a peer reaches this region (what addresses into it carry).
    pub fn id(&self) -> RegionId {
        self.id
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty (never: regions are at least a page).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// Base address of the mapping.
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// The header.
    pub fn header(&self) -> &RegionHeader {
        // SAFETY: the mapping is page aligned and at least one page long;
        // RegionHeader's fields are atomics or plain integers valid for any
        // bit pattern.
        unsafe { &*(self.map.as_ptr() as *const RegionHeader) }
    }

    /// Geometry, endpoint count and counter count (validated at attach or
    /// create).
    pub fn geometry(&self) -> (EpGeometry, u32, u32) {
        let h = self.header();
        // SAFETY: validated fields of a mapped header; volatile since shared.
        unsafe {
            (
                std::ptr::addr_of!(h.geometry).read_volatile(),
                std::ptr::addr_of!(h.n_eps).read_volatile(),
                std::ptr::addr_of!(h.n_counters).read_volatile(),
            )
        }
    }

    /// Owner pid and start time.
    pub fn owner(&self) -> (u32, u64) {
        let h = self.header();
        // SAFETY: mapped header fields, plain integers.
        unsafe {
            (std::ptr::addr_of!(h.owner_pid).read_volatile(), std::ptr::addr_of!(h.owner_start_time).read_volatile())
        }
    }

    /// Whether the region's owner runs in another PID namespace than this
    /// process (both known and different): its pid then names nothing here,
    /// or another process, and single copy with it must not be tried.
    pub fn foreign_pids(&self) -> bool {
        let h = self.header();
        // SAFETY: a mapped header field, plain integer, published before
        // magic (volatile: a peer wrote it).
        let theirs = unsafe { std::ptr::addr_of!(h.pid_ns).read_volatile() };
        let ours = crate::job::pid_ns();
        theirs != 0 && ours != 0 && theirs != ours
    }

    /// Whether the region's owner still lives: it holds its lock (see the
    /// module's doc), or, for a region of a build that took none, its pid
    /// and start time still name a live process. Always true of our own.
    pub fn alive(&self) -> bool {
        if self.owned {
            return true;
        }
        let (pid, start) = self.owner();
        owner_locked(&self.file) || owner_alive(pid, start)
    }

    /// Pointer to `T` at `off`, bounds- and alignment-checked.
    pub fn at<T>(&self, off: usize) -> Result<*mut T> {
        let end = off.checked_add(std::mem::size_of::<T>());
        if end.is_none_or(|e| e > self.len()) || !off.is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::with(ErrorKind::Io, format!("offset {off} out of region bounds")));
        }
        // SAFETY: off + size_of::<T>() <= len, so the pointer stays inside the mapping.
        Ok(unsafe { self.base().add(off) as *mut T })
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("name", &self.name)
            .field("len", &self.len())
            .field("owned", &self.owned)
            .finish()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // A child forked without exec drops its copy of the parent's
        // region: that closes nothing of the parent's (id.pid is the
        // creator's pid in our own region's id).
        if self.owned && self.id.pid == std::process::id() {
            // SYNC: pairs with the acquire load of the state in the peers'
            // life check (progress::peer_gone); nothing written before it
            // needs publishing (a peer that reads CLOSING only fails what it
            // has pending with us), so the release is more than needed.
            self.header().state.store(state::CLOSING, Ordering::Release);
            if self.id.named() {
                let _ = unlink_shm(self.name.as_str());
            }
        }
    }
}

/// A fresh region file with no name in `dir`: `O_TMPFILE` (never linked:
/// `O_EXCL`), or where the file system has none, a file `name` made
/// exclusively and unlinked at once.
pub(crate) fn create_anonymous(dir: &std::path::Path, name: &str) -> rustix::io::Result<rustix::fd::OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let mode = Mode::from_raw_mode(0o600);
    match rustix::fs::open(dir, OFlags::TMPFILE | OFlags::RDWR | OFlags::EXCL | OFlags::CLOEXEC, mode) {
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR | rustix::io::Errno::INVAL) => {
            let path = dir.join(name);
            let fd = rustix::fs::open(
                &path,
                OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                mode,
            )?;
            rustix::fs::unlink(&path)?;
            Ok(fd)
        }
        r => r,
    }
}

/// Opens a peer's anonymous region through its holder's descriptor. The
/// link is first opened `O_PATH` (no open of the file itself: no side
/// effect, whatever a reused pid or descriptor names) and must be a
/// regular file with no name left (`st_nlink` 0) on the shared memory
/// directory's file system; only then is it reopened for reading and
/// writing, through our own descriptor.
pub(crate) fn open_anonymous(id: &RegionId, dir: &std::path::Path) -> Result<File> {
    use rustix::fs::{Mode, OFlags};
    let path = id.path();
    let hint = "if the ranks run in different PID namespaces, set SHMFAB_REGIONS=named on every rank";
    let o = rustix::fs::open(path.as_str(), OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(|e| match e {
        rustix::io::Errno::NOENT => Error::with(
            ErrorKind::AddrNotAvail,
            format!("peer region {} is gone: {path} does not exist (its owner exited; {hint})", id.name()),
        ),
        _ => Error::with(
            ErrorKind::from_errno(e.raw_os_error()),
            format!("cannot open peer region {} through {path}: {e} ({hint})", id.name()),
        ),
    })?;
    let st = rustix::fs::fstat(&o)?;
    let dst = rustix::fs::stat(dir)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || st.st_nlink != 0 || st.st_dev != dst.st_dev {
        return Err(Error::with(
            ErrorKind::AddrNotAvail,
            format!("peer region {} is gone: {path} is not a region of {} ({hint})", id.name(), dir.display()),
        ));
    }
    let mine = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&o));
    let fd = rustix::fs::open(
        mine.as_str(),
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| {
        Error::with(
            ErrorKind::from_errno(e.raw_os_error()),
            format!("cannot open peer region {} through {path}: {e}", id.name()),
        )
    })?;
    Ok(File::from(fd))
}

fn fallocate(file: &File, off: usize, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), off as u64, len as u64).map_err(|e| {
        Error::with(
            ErrorKind::from_errno(e.raw_os_error()),
            format!("cannot reserve {len} bytes of shared memory: {e}"),
        )
    })
}

/// Whether some process holds a lock on `file`, shared or exclusive (the
/// ranks of a starting job hold shared ones on its boot file: `launch`):
/// a non-blocking exclusive lock on this descriptor fails. Whether a
/// region's owner lives is [`owner_locked`]'s question. `file` must be an open of its own (not
/// the owner's descriptor, whose lock this would take over). When the lock
/// is free it is taken for an instant and released; an error other than
/// "held" counts as held (never call a region dead on a doubt).
pub fn locked(file: &File) -> bool {
    refused(file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
}

/// Whether the non-blocking lock `op` on `file` is refused (held by
/// another); when it is taken, it is released at once.
fn refused(file: &File, op: rustix::fs::FlockOperation) -> bool {
    use rustix::fs::{flock, FlockOperation};
    match flock(file, op) {
        Ok(()) => {
            let _ = flock(file, FlockOperation::Unlock);
            false
        }
        Err(_) => true,
    }
}

/// Whether the owner of a region (or of a domain's RMA file) holds its
/// exclusive lock: a non-blocking *shared* lock on this descriptor (an
/// open of its own) fails. Probes by other processes at the same instant
/// take shared locks too, which do not refuse ours: with [`locked`]'s
/// exclusive probe, two processes checking a dead owner at once could
/// each see the other's probe as the owner, and call it alive for one
/// more check period (a peer's RMA on a dead target's heap then went on
/// succeeding after it had failed: `tests/rma.rs`, named regions, once
/// in a CI run). When the owner is gone the shared lock is taken for an
/// instant and released; an error other than "held" counts as held.
pub fn owner_locked(file: &File) -> bool {
    refused(file, rustix::fs::FlockOperation::NonBlockingLockShared)
}

/// What [`scan`] found about one region.
#[derive(Debug, Clone)]
pub struct RegionInfo {
    /// Its name ([`region_name`]; its file name in /dev/shm or
    /// `SHMFAB_SHM_DIR` when named, or a boot region's file name).
    pub name: String,
    /// How to reach it ([`Region::attach`]); a boot region's has the name's
    /// job and token 0.
    pub id: RegionId,
    /// Whether it has a name in the shared memory directory (only those
    /// are left behind by a crash, and removed by [`clean_dead`]).
    pub named: bool,
    /// Owner pid (0 if the header was unreadable).
    pub pid: u32,
    /// Whether its owner lives (it holds its lock; see the module's doc).
    /// An anonymous region whose owner died is still there while a peer
    /// holds it, until that peer exits.
    pub alive: bool,
    /// Layout version written in it.
    pub layout_version: u32,
    /// Job hash.
    pub job: u32,
    /// Bytes.
    pub size: u64,
}

/// Lists this user's regions (optionally of one job) with their owners'
/// state: the named ones in [`shm_dir`], and the anonymous ones held by
/// the live processes this one may look into (`/proc/*/fd`). None if the
/// directory is not usable (the tools check it first with [`shm_dir`] to
/// say why).
pub fn scan(job: Option<u32>) -> Vec<RegionInfo> {
    let mut out = scan_named(job);
    out.extend(scan_anonymous(job));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The first bytes of a region header, as [`scan`] reads them.
struct HeaderWords {
    magic: u64,
    version: u32,
    pid: u32,
    start: u64,
    job: u32,
    token: u32,
    /// [`shm_layout::BOOT_MARK`] in a boot region (whose job hash is then
    /// where a domain region has its token).
    mark: u32,
}

fn header_words(f: &File) -> Option<HeaderWords> {
    use std::os::unix::fs::FileExt;
    let mut hdr = [0u8; 64];
    f.read_exact_at(&mut hdr, 0).ok()?;
    let u32_at = |i: usize| u32::from_le_bytes(hdr[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(hdr[i..i + 8].try_into().unwrap());
    Some(HeaderWords {
        magic: u64_at(0),
        version: u32_at(8),
        pid: u32_at(16),
        start: u64_at(24),
        job: u32_at(std::mem::offset_of!(RegionHeader, job)),
        token: u32_at(std::mem::offset_of!(RegionHeader, token)),
        mark: u32_at(std::mem::offset_of!(RegionHeader, n_counters)),
    })
}

/// Named regions (and boot regions) in the shared memory directory.
fn scan_named(job: Option<u32>) -> Vec<RegionInfo> {
    let prefix = format!("{PREFIX}{}.", uid());
    let mut out = Vec::new();
    let Ok(dir) = shm_dir().and_then(|d| std::fs::read_dir(d).map_err(Error::from)) else {
        return out;
    };
    for ent in dir.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let mut parts = rest.split('.');
        let jh = parts.next().and_then(|s| u32::from_str_radix(s, 16).ok()).unwrap_or(0);
        let token = parts.next().and_then(|s| u32::from_str_radix(s, 16).ok()).unwrap_or(0);
        if job.is_some_and(|j| j != jh) {
            continue;
        }
        let path = shm_path(&name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.file_type().is_file() {
            continue;
        }
        // Not opened (not readable): judged by its age below, as a region
        // never initialised.
        let f = File::open(&path).ok();
        let hdr = f.as_ref().and_then(header_words);
        // A named domain's RMA file (`<region>.rma`, crate::mr): its owner
        // locks it before publishing its magic, as a region's.
        let rma = rest.ends_with(".rma");
        let init = hdr.as_ref().filter(|h| !rma && h.magic == MAGIC);
        let rma_init = rma && hdr.as_ref().is_some_and(|h| h.magic == shm_layout::rma::RMA_MAGIC);
        // The lock is looked at after the header was read: its creator
        // locks before it publishes magic, so magic seen and then no lock
        // means the owner is gone.
        // A boot region is alive while any rank holds its shared lock; a
        // domain region or RMA file while its owner holds its own.
        let boot = rest.ends_with(".boot") || hdr.as_ref().is_some_and(|h| h.mark == shm_layout::BOOT_MARK);
        let held = if boot { locked } else { owner_locked };
        let alive = f.as_ref().is_some_and(held)
            || match init {
                _ if rma_init => false,
                Some(h) => owner_alive(h.pid, h.start),
                // Not initialised: alive while young (its creator may be
                // between open and the magic store), dead after 30 s.
                None => meta.modified().ok().and_then(|m| m.elapsed().ok()).is_none_or(|age| age.as_secs() < 30),
            };
        out.push(RegionInfo {
            name,
            id: RegionId { pid: init.map_or(0, |h| h.pid), fd: Address::NAMED, job: jh, token },
            named: true,
            pid: init.map_or(0, |h| h.pid),
            alive,
            layout_version: hdr.as_ref().map_or(0, |h| h.version),
            job: jh,
            size: meta.len(),
        });
    }
    out
}

/// Anonymous regions: deleted files of the shared memory directory held
/// open by live processes, each listed once (by inode) whoever holds it.
fn scan_anonymous(job: Option<u32>) -> Vec<RegionInfo> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let Ok(dir) = shm_dir() else {
        return out;
    };
    let real = std::fs::canonicalize(&dir).unwrap_or_else(|_| dir.clone());
    let inside = real.to_string_lossy().trim_end_matches('/').to_string();
    let me = uid();
    let mut seen = std::collections::HashSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        // Other users' processes (EACCES) and exited ones are skipped.
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for f in fds.flatten() {
            let Some(fd) = f.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(target) = std::fs::read_link(f.path()) else {
                continue;
            };
            // Only files with no name left, made in the directory (as the
            // kernel names it: symlinks resolved), can be its regions.
            let t = target.to_string_lossy();
            if !t.ends_with(" (deleted)") || !t.strip_prefix(&*inside).is_some_and(|rest| rest.starts_with('/')) {
                continue;
            }
            let id = RegionId { pid, fd, job: 0, token: 0 };
            let Ok(file) = open_anonymous(&id, &dir) else {
                continue; // not on the shm directory's file system, gone, ...
            };
            let Ok(meta) = file.metadata() else {
                continue;
            };
            if meta.uid() != me || !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            let Some(h) = header_words(&file).filter(|h| h.magic == MAGIC) else {
                continue; // not a region, or one being made
            };
            // A boot region of a starting job, or a domain region.
            let boot = h.mark == shm_layout::BOOT_MARK;
            let (jh, token) = if boot { (h.token, 0) } else { (h.job, h.token) };
            if job.is_some_and(|j| j != jh) {
                continue;
            }
            out.push(RegionInfo {
                name: if boot { format!("{PREFIX}{me}.{jh:08x}.boot") } else { region_name(me, jh, token) },
                id: RegionId { pid, fd, job: jh, token },
                named: false,
                pid: h.pid,
                // As in scan_named: any holder for a boot region.
                alive: if boot { locked(&file) } else { owner_locked(&file) },
                layout_version: h.version,
                job: jh,
                size: meta.len(),
            });
        }
    }
    out
}

/// Removes this user's named regions whose owners are dead; returns them.
/// (Anonymous regions need no cleaning: the kernel frees them with the
/// last process that holds them.)
pub fn clean_dead(dry_run: bool) -> Vec<RegionInfo> {
    let mut dead: Vec<_> = scan_named(None).into_iter().filter(|r| !r.alive).collect();
    dead.sort_by(|a, b| a.name.cmp(&b.name));
    if !dry_run {
        for r in &dead {
            let _ = unlink_shm(r.name.as_str());
        }
    }
    dead
}

/// Removes every named region of a job whatever its owner's state (test
/// and launcher cleanup).
pub fn remove_job(job: u32) -> usize {
    let all = scan_named(Some(job));
    for r in &all {
        let _ = unlink_shm(r.name.as_str());
    }
    all.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_lock_probes_do_not_see_each_other() {
        let dir = std::env::temp_dir().join(format!("shmfab-owner-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("region");
        let open = || File::options().read(true).write(true).create(true).truncate(false).open(&path).unwrap();
        let (owner, prober, mine) = (open(), open(), open());
        use rustix::fs::{flock, FlockOperation};
        // A dead owner (no exclusive lock) while another process's probe
        // holds its shared lock for an instant: still dead to us, where
        // the exclusive probe saw that probe as an owner.
        flock(&prober, FlockOperation::LockShared).unwrap();
        assert!(!owner_locked(&mine), "another probe is not an owner");
        assert!(locked(&mine), "the exclusive probe sees any holder");
        flock(&prober, FlockOperation::Unlock).unwrap();
        // A live owner: both probes see it.
        flock(&owner, FlockOperation::LockExclusive).unwrap();
        assert!(owner_locked(&mine) && locked(&mine));
        flock(&owner, FlockOperation::Unlock).unwrap();
        assert!(!owner_locked(&mine) && !locked(&mine), "no holder at all");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn job(what: &str) -> u32 {
        job_hash(&format!("unit-{what}-{}", std::process::id()))
    }

    #[test]
    fn create_attach_and_unlink_named() {
        let g = EpGeometry::DEFAULT;
        let r = Region::create(job("named"), &g, 2, 4, Backing::Named).unwrap();
        let name = r.name().to_string();
        assert!(r.id().named());
        let p = Region::attach(&r.id()).unwrap();
        assert_eq!(p.geometry(), (g, 2, 4));
        assert_eq!(p.owner().0, std::process::id());
        let meta = std::fs::metadata(shm_path(&name)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        drop(p);
        let id = r.id();
        drop(r);
        assert!(std::fs::metadata(shm_path(&name)).is_err(), "unlinked on close");
        assert!(Region::attach(&id).is_err());
    }

    #[test]
    fn an_anonymous_region_has_no_name_and_is_reached_through_its_owner() {
        let g = EpGeometry::DEFAULT;
        let j = job("anon");
        let r = Region::create(j, &g, 2, 4, Backing::Anonymous).unwrap();
        let id = r.id();
        assert!(!id.named());
        assert_eq!(id.pid, std::process::id());
        assert!(std::fs::metadata(shm_path(r.name())).is_err(), "no file in the directory");
        assert!(scan_named(Some(j)).is_empty());
        let p = Region::attach(&id).unwrap();
        assert_eq!(p.geometry(), (g, 2, 4));
        assert!(p.alive());
        // The directory is a file system, not a string: a trailing slash or
        // a symlink to it opens the region as well.
        let link = std::env::temp_dir().join(format!("shmfab-unit-link-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(shm_dir().unwrap(), &link).unwrap();
        let via = [std::path::PathBuf::from(format!("{}/", shm_dir().unwrap().display())), link.clone()];
        for d in via {
            assert!(open_anonymous(&id, &d).is_ok(), "{d:?}");
        }
        let _ = std::fs::remove_file(&link);
        // The scan finds it through our descriptors, once, alive.
        let found = scan(Some(j));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].alive && !found[0].named && found[0].name == r.name(), "{found:?}");
        assert!(clean_dead(true).iter().all(|d| d.job != j), "anonymous regions are never cleaned");
        // Another token, or another job, at the same pid and descriptor is
        // a region that is gone.
        for bad in [RegionId { token: id.token ^ 2, ..id }, RegionId { job: id.job ^ 1, ..id }] {
            let e = Region::attach(&bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::AddrNotAvail, "{e}");
            assert!(e.to_string().contains("of another owner"), "{e}");
        }
        drop(r);
        drop(p);
        assert!(scan(Some(j)).is_empty(), "gone with its last holder");
        assert_eq!(Region::attach(&id).unwrap_err().kind(), ErrorKind::AddrNotAvail);
    }

    #[test]
    fn attach_refuses_other_layout_version_naming_both() {
        let r = Region::create(job("version"), &EpGeometry::DEFAULT, 1, 1, Backing::Anonymous).unwrap();
        // SAFETY: our own fresh region; only this test touches it.
        unsafe {
            let h = r.base() as *mut RegionHeader;
            std::ptr::addr_of_mut!((*h).layout_version).write(LAYOUT_VERSION + 6);
        }
        let e = Region::attach(&r.id()).unwrap_err();
        let s = e.to_string();
        assert!(s.contains(&format!("layout version {}", LAYOUT_VERSION + 6)), "{s}");
        assert!(s.contains(&format!("layout version {LAYOUT_VERSION}")), "{s}");
    }

    #[test]
    fn a_full_dev_shm_is_an_error_that_says_what_to_do() {
        // A region larger than /dev/shm: the reservation fails with ENOSPC
        // at creation (not SIGBUS later), and says what to do.
        let huge = EpGeometry { pool_chunks: 65536, chunk_size: 1 << 24, ..EpGeometry::DEFAULT };
        for backing in [Backing::Anonymous, Backing::Named] {
            let r = Region::create(job("full"), &huge, 1, 1, backing).unwrap();
            let sec_off = shm_layout::eps_offset(1);
            let e = r.reserve(sec_off, huge.section_size()).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NoSpc, "{e}");
            assert!(e.to_string().contains("/dev/shm is too small or full"), "{e}");
        }
    }

    #[test]
    fn a_region_is_alive_while_locked_whatever_pid_its_header_says() {
        // A live owner in another PID namespace writes a pid and start time
        // that mean nothing here: its region stays alive, and is not cleaned.
        let j = job("lock");
        let r = Region::create(j, &EpGeometry::DEFAULT, 1, 1, Backing::Named).unwrap();
        // SAFETY: our own fresh region; only this test touches it.
        unsafe {
            let h = r.base() as *mut RegionHeader;
            std::ptr::addr_of_mut!((*h).owner_pid).write(0x3fff_fff0);
            std::ptr::addr_of_mut!((*h).owner_start_time).write(1);
        }
        assert!(!owner_alive(0x3fff_fff0, 1), "the recorded owner is no live process here");
        let p = Region::attach(&r.id()).unwrap();
        assert!(p.alive(), "the owner holds its lock");
        let found = scan(Some(j));
        assert_eq!(found.len(), 1);
        assert!(found[0].alive, "{found:?}");
        assert!(clean_dead(true).iter().all(|d| d.name != r.name()), "a live region would be cleaned");
        // The lock is what keeps it alive: released, the region is dead.
        rustix::fs::flock(r.file(), rustix::fs::FlockOperation::Unlock).unwrap();
        assert!(!p.alive());
        // Dead, or already removed by a clean of another test's domain.
        assert!(scan(Some(j)).iter().all(|r| !r.alive));
    }

    #[test]
    fn the_shm_dir_setting_is_checked() {
        let err = |v: &str| check_dir(v).unwrap_err().to_string();
        assert!(err("relative/dir").contains("SHMFAB_SHM_DIR=\"relative/dir\": not an absolute path"));
        assert!(err("/nonexistent/shmfab").contains("SHMFAB_SHM_DIR=\"/nonexistent/shmfab\": cannot use it"));
        assert!(err("/proc/self/stat").contains("not a directory"));
        assert_eq!(check_dir("/dev/shm").unwrap(), std::path::PathBuf::from("/dev/shm"));
    }

    #[test]
    fn attach_opens_only_regions() {
        // A descriptor that is not a deleted file of the shm directory (a
        // pid reused, an address made up) is never opened.
        let me = std::process::id();
        let devnull = File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&devnull) as u32;
        for id in [RegionId { pid: me, fd, job: 1, token: 1 }, RegionId { pid: me, fd: 0, job: 1, token: 1 }] {
            let e = Region::attach(&id).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::AddrNotAvail, "{e}");
            assert!(e.to_string().contains("not a region"), "{e}");
        }
        let gone = RegionId { pid: me, fd: 1 << 30, job: 1, token: 1 };
        assert_eq!(Region::attach(&gone).unwrap_err().kind(), ErrorKind::AddrNotAvail);
        let missing = RegionId { pid: me, fd: Address::NAMED, job: 0, token: 0xdead };
        assert_eq!(Region::attach(&missing).unwrap_err().kind(), ErrorKind::AddrNotAvail);
        // A deleted file of /dev/shm that is no region: refused by its checks.
        let f = create_anonymous(&shm_dir().unwrap(), "shmfab.unit-not-a-region").unwrap();
        let f = File::from(f);
        f.set_len(PAGE as u64).unwrap();
        let id = RegionId { pid: me, fd: std::os::fd::AsRawFd::as_raw_fd(&f) as u32, job: 1, token: 1 };
        let e = Region::attach(&id).unwrap_err();
        assert!(e.to_string().contains("not initialised"), "{e}");
    }
}
