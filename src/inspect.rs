//! `shmfab inspect [JOB]`: what a live job's regions hold, read from shared
//! memory without disturbing the job: ranks and pids (alive or dead), per
//! endpoint what its owner last published (queued sends, posted receives,
//! unexpected messages, receives in progress, a progress heartbeat), ring
//! occupancy per inbound peer, the overflow queue, the pool, the counters,
//! and a job's boot region while it starts. This is what a user runs when
//! a job hangs.

use crate::domain::Section;
use crate::error::Result;
use crate::region::{scan, Region, RegionInfo};
use crate::sync::Ordering;
use shm_layout::{ep_state, BootHeader, MAGIC};
use std::fmt::Write;

/// The job hash a JOB argument names: 8 hex digits as printed in region
/// names, or a job id (hashed).
pub fn job_arg(s: &str) -> u32 {
    if s.len() == 8 {
        if let Ok(h) = u32::from_str_radix(s, 16) {
            return h;
        }
    }
    crate::region::job_hash(s)
}

fn who(all: &[RegionInfo], a: &shm_layout::Address) -> String {
    let name = crate::region::region_name(a.uid, a.job, a.token);
    let pid = all.iter().find(|r| r.name == name).map(|r| {
        let state = if r.alive { "alive" } else { "dead" };
        format!("pid {} {state}", r.pid)
    });
    format!("{} ({})", crate::av::AddressVector::straddr(a), pid.unwrap_or_else(|| "region gone".into()))
}

/// A report on the regions of one job (or all of this user's).
pub fn inspect(job: Option<u32>) -> Result<String> {
    let all = scan(None);
    let mine: Vec<&RegionInfo> = all.iter().filter(|r| job.is_none_or(|j| r.job == j)).collect();
    let mut out = String::new();
    if mine.is_empty() {
        let _ = writeln!(out, "no regions{}", job.map_or(String::new(), |j| format!(" for job {j:08x}")));
        return Ok(out);
    }
    let mut jobs: Vec<u32> = mine.iter().map(|r| r.job).collect();
    jobs.dedup();
    for j in jobs {
        let _ = writeln!(out, "job {j:08x}");
        for r in mine.iter().filter(|r| r.job == j) {
            let state = if r.alive { "alive" } else { "DEAD" };
            if r.name.ends_with(".boot") {
                boot(&mut out, r);
                continue;
            }
            let _ = writeln!(out, "  region {} (pid {} {state}, {} KiB)", r.name, r.pid, r.size / 1024);
            match Region::attach(&r.name) {
                Ok(reg) => region(&mut out, &reg, &all),
                Err(e) => {
                    let _ = writeln!(out, "    cannot read it: {e}");
                }
            }
        }
    }
    Ok(out)
}

fn region(out: &mut String, reg: &Region, all: &[RegionInfo]) {
    let (g, n_eps, _) = reg.geometry();
    for i in 0..n_eps {
        let Ok(sec) = Section::of(reg, i) else { continue };
        let h = sec.header();
        if h.state.load(Ordering::Acquire) != ep_state::OPEN {
            continue;
        }
        let _ = writeln!(
            out,
            "    endpoint {i} (generation {}): {} sends queued or in flight, {} receives posted, {} unexpected, {} receives in progress; {} progress passes",
            h.generation.load(Ordering::Relaxed),
            h.tx_queued.load(Ordering::Relaxed),
            h.rx_posted.load(Ordering::Relaxed),
            h.unexpected.load(Ordering::Relaxed),
            h.rx_active.load(Ordering::Relaxed),
            h.passes.load(Ordering::Relaxed),
        );
        let claimed = h.claimed.load(Ordering::Acquire);
        for s in 0..g.n_slots {
            if claimed & (1 << s) == 0 {
                continue;
            }
            let slot = sec.slot(s);
            // SAFETY: plain data in a mapped slot entry, written before its
            // claimed bit (acquired above).
            let a = unsafe { std::ptr::addr_of!(slot.addr).read_volatile() };
            // SAFETY: ringctl_at(s) is inside the section (s < n_slots).
            let ctl = unsafe { &*sec.ringctl_at(s) };
            let (tail, head) = (ctl.tail.v.load(Ordering::Relaxed), ctl.head.v.load(Ordering::Relaxed));
            let _ = writeln!(
                out,
                "      ring {s} from {}: {} of {} cells in flight",
                who(all, &a),
                tail.saturating_sub(head),
                g.ring_cells
            );
        }
        // SAFETY: the overflow control block is inside the section.
        let ovf = unsafe { &*sec.ovfctl };
        let queued = ovf.enqueue.v.load(Ordering::Relaxed).saturating_sub(ovf.dequeue.v.load(Ordering::Relaxed));
        if h.ovf_used.load(Ordering::Relaxed) != 0 || queued != 0 {
            let _ = writeln!(out, "      overflow queue: {queued} of {} entries", g.ovf_cells);
        }
        let pool = sec.pool();
        let _ = writeln!(out, "      pool: {} of {} chunks in use", pool.in_use(), pool.len());
    }
    let (_, _, n_counters) = reg.geometry();
    for c in 0..n_counters as usize {
        let Ok(p) =
            reg.at::<shm_layout::Counter>(shm_layout::COUNTERS_OFFSET + c * std::mem::size_of::<shm_layout::Counter>())
        else {
            break;
        };
        // SAFETY: in bounds (checked by at()); atomics only.
        let cn = unsafe { &*p };
        let (v, e) = (cn.value.v.load(Ordering::Relaxed), cn.err.v.load(Ordering::Relaxed));
        if v != 0 || e != 0 {
            let _ = writeln!(out, "    counter {c}: {v} (errors {e})");
        }
    }
}

fn boot(out: &mut String, r: &RegionInfo) {
    let path = format!("{}/{}", crate::region::SHM_DIR, r.name);
    let read = std::fs::File::open(&path).ok().and_then(|f| {
        // SAFETY: a read-only private mapping of a file we just opened; we
        // only read atomics and integers from it.
        let m = unsafe { memmap2::MmapOptions::new().len(std::mem::size_of::<BootHeader>()).map(&f) }.ok()?;
        // SAFETY: the mapping is one page, page aligned.
        let h = unsafe { &*(m.as_ptr() as *const BootHeader) };
        (h.magic.load(Ordering::Acquire) == MAGIC)
            .then(|| (h.arrived.load(Ordering::Relaxed), h.size, h.departed.load(Ordering::Relaxed)))
    });
    match read {
        Some((arrived, size, departed)) => {
            let _ = writeln!(
                out,
                "  boot region {}: {arrived} of {size} ranks arrived, {departed} done (the job is starting or a rank never came)",
                r.name
            );
        }
        None => {
            let _ = writeln!(out, "  boot region {} (not initialised)", r.name);
        }
    }
}
