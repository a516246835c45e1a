//! Read-only snapshots of what a region holds, for `shmfab inspect`: per
//! open endpoint what its owner last published (queued sends, posted
//! receives, unexpected messages, receives in progress, a progress
//! heartbeat), ring occupancy per inbound peer, the overflow queue, the
//! pool and the counters; and how far a job's boot region got. Taking one
//! only loads: it never disturbs the job.
//!
//! ```
//! use shmfab::internal::{region::{job_hash, Backing, Region}, snapshot};
//! let job = job_hash(&format!("snapshot-doc-{}", std::process::id()));
//! let r = Region::create(job, &shm_layout::EpGeometry::DEFAULT, 1, 2, Backing::Anonymous).unwrap();
//! let s = snapshot::region(&r);
//! assert!(s.endpoints.is_empty(), "no endpoint opened");
//! assert_eq!(s.counters.len(), 2);
//! ```

use crate::domain::Section;
use crate::region::Region;
use crate::sync::Ordering;
use shm_layout::{ep_state, Address, BootHeader, MAGIC};

/// One claimed inbound ring of an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingSnapshot {
    /// Ring slot.
    pub slot: u32,
    /// The sender that claimed it.
    pub from: Address,
    /// Cells published by the sender and not yet consumed (a lap end's
    /// message counts the cells it skips: up to a ring less 64 for one
    /// message).
    pub in_flight: u64,
}

/// What an open endpoint's owner last published, and its queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpSnapshot {
    /// Endpoint index in its region.
    pub index: u32,
    /// Generation of the section (bumped at each reopen).
    pub generation: u32,
    /// Sends queued or in flight.
    pub tx_queued: u32,
    /// Receives posted.
    pub rx_posted: u32,
    /// Unexpected messages held.
    pub unexpected: u32,
    /// Receives in progress.
    pub rx_active: u32,
    /// Progress passes (a heartbeat).
    pub passes: u64,
    /// Claimed rings, by slot.
    pub rings: Vec<RingSnapshot>,
    /// Cells per ring.
    pub ring_cells: u32,
    /// Whether a sender ever used the overflow queue (non-zero if so).
    pub ovf_used: u32,
    /// Entries in the overflow queue.
    pub ovf_queued: u64,
    /// Entries the overflow queue holds.
    pub ovf_cells: u32,
    /// Pool chunks in use.
    pub pool_in_use: u32,
    /// Pool chunks.
    pub pool_chunks: u32,
}

/// A counter of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterSnapshot {
    /// Index in the region's counter table.
    pub index: usize,
    /// Success value.
    pub value: u64,
    /// Error value.
    pub err: u64,
}

/// A region's open endpoints and its counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegionSnapshot {
    /// Open endpoints, by index.
    pub endpoints: Vec<EpSnapshot>,
    /// Every counter of the table.
    pub counters: Vec<CounterSnapshot>,
}

/// Snapshot of a mapped region (ours or attached).
pub fn region(reg: &Region) -> RegionSnapshot {
    let (g, n_eps, n_counters) = reg.geometry();
    let mut out = RegionSnapshot::default();
    for i in 0..n_eps {
        let Ok(sec) = Section::of(reg, i) else { continue };
        let h = sec.header();
        if h.state.load(Ordering::Acquire) != ep_state::OPEN {
            continue;
        }
        let claimed = h.claimed.load(Ordering::Acquire);
        let mut rings = Vec::new();
        for s in 0..g.n_slots {
            if claimed & (1 << s) == 0 {
                continue;
            }
            let slot = sec.slot(s);
            // SAFETY: plain data in a mapped slot entry, written before its
            // claimed bit (acquired above).
            let from = unsafe { std::ptr::addr_of!(slot.addr).read_volatile() };
            // SAFETY: ringctl_at(s) is inside the section (s < n_slots).
            let ctl = unsafe { &*sec.ringctl_at(s) };
            let (tail, head) = (ctl.tail.v.load(Ordering::Relaxed), ctl.head.v.load(Ordering::Relaxed));
            rings.push(RingSnapshot { slot: s, from, in_flight: tail.saturating_sub(head) });
        }
        // SAFETY: the overflow control block is inside the section.
        let ovf = unsafe { &*sec.ovfctl };
        let pool = sec.pool();
        out.endpoints.push(EpSnapshot {
            index: i,
            generation: h.generation.load(Ordering::Relaxed),
            tx_queued: h.tx_queued.load(Ordering::Relaxed),
            rx_posted: h.rx_posted.load(Ordering::Relaxed),
            unexpected: h.unexpected.load(Ordering::Relaxed),
            rx_active: h.rx_active.load(Ordering::Relaxed),
            passes: h.passes.load(Ordering::Relaxed),
            rings,
            ring_cells: g.ring_cells,
            ovf_used: h.ovf_used.load(Ordering::Relaxed),
            ovf_queued: ovf.enqueue.v.load(Ordering::Relaxed).saturating_sub(ovf.dequeue.v.load(Ordering::Relaxed)),
            ovf_cells: g.ovf_cells,
            pool_in_use: pool.in_use(),
            pool_chunks: pool.len(),
        });
    }
    for c in 0..n_counters as usize {
        let off = shm_layout::COUNTERS_OFFSET + c * std::mem::size_of::<shm_layout::Counter>();
        let Ok(p) = reg.at::<shm_layout::Counter>(off) else {
            break;
        };
        // SAFETY: in bounds (checked by at()); atomics only.
        let cn = unsafe { &*p };
        out.counters.push(CounterSnapshot {
            index: c,
            value: cn.value.v.load(Ordering::Relaxed),
            err: cn.err.v.load(Ordering::Relaxed),
        });
    }
    out
}

/// How far a job's boot region got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootSnapshot {
    /// Ranks that wrote their entry.
    pub arrived: u32,
    /// Ranks of the job.
    pub size: u32,
    /// Ranks that read every entry and went on.
    pub departed: u32,
}

/// The boot region at `path` (a named one's file, or an anonymous one's
/// `/proc/<pid>/fd/<fd>`: [`crate::region::RegionInfo`] says which), if it is
/// readable and initialised.
pub fn boot(path: &str) -> Option<BootSnapshot> {
    let f = std::fs::File::open(path).ok()?;
    // SAFETY: a read-only private mapping of a file we just opened; we only
    // read atomics and integers from it.
    let m = unsafe { memmap2::MmapOptions::new().len(std::mem::size_of::<BootHeader>()).map(&f) }.ok()?;
    // SAFETY: the mapping is one page, page aligned.
    let h = unsafe { &*(m.as_ptr() as *const BootHeader) };
    // SYNC: pairs with the release store of magic when the boot region is made.
    (h.magic.load(Ordering::Acquire) == MAGIC).then(|| BootSnapshot {
        arrived: h.arrived.load(Ordering::Relaxed),
        size: h.size,
        departed: h.departed.load(Ordering::Relaxed),
    })
}
