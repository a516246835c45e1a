//! `shmfab inspect [JOB]`: what a live job's regions hold, read from shared
//! memory without disturbing the job: ranks and pids (alive or dead), per
//! endpoint what its owner last published (queued sends, posted receives,
//! unexpected messages, receives in progress, a progress heartbeat), ring
//! occupancy per inbound peer, the overflow queue, the pool, the counters,
//! and a job's boot region while it starts. This is what a user runs when
//! a job hangs.

use shmfab::internal::region::{scan, Region, RegionInfo};
use shmfab::{Error, ErrorKind, Result};
use std::fmt::Write;

/// The job hash a JOB argument names: 8 hex digits as printed in region
/// names, or a job id (hashed).
pub fn job_arg(s: &str) -> u32 {
    if s.len() == 8 {
        if let Ok(h) = u32::from_str_radix(s, 16) {
            return h;
        }
    }
    shmfab::internal::region::job_hash(s)
}

fn who(all: &[RegionInfo], a: &shm_layout::Address) -> String {
    let id = shmfab::internal::region::RegionId::of(a);
    let pid = all.iter().find(|r| r.job == id.job && r.id.token == id.token && r.pid == id.pid).map(|r| {
        let state = if r.alive { "alive" } else { "dead" };
        format!("pid {} {state}", r.pid)
    });
    format!("{} ({})", shmfab::av::AddressVector::straddr(a), pid.unwrap_or_else(|| "region gone".into()))
}

/// A report on the regions of one job (or all of this user's). A job
/// named that has no region is `NoEnt` (the command exits non-zero); with
/// no job named, no region at all is an empty report, not an error.
pub fn inspect(job: Option<u32>) -> Result<String> {
    // Where the regions are: an unusable SHMFAB_SHM_DIR is an error.
    shmfab::internal::region::shm_dir()?;
    let all = scan(None);
    let mine: Vec<&RegionInfo> = all.iter().filter(|r| job.is_none_or(|j| r.job == j)).collect();
    let mut out = String::new();
    if mine.is_empty() {
        if let Some(j) = job {
            return Err(Error::with(ErrorKind::NoEnt, format!("no regions for job {j:08x}: no such job is running")));
        }
        let _ = writeln!(out, "no regions");
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
            if r.name.ends_with(".rma") {
                let _ = writeln!(out, "  RMA file {} ({state}, {} KiB, named)", r.name, r.size / 1024);
                continue;
            }
            let how = if r.named { "named".to_string() } else { format!("anonymous, {}", r.id.path()) };
            let _ = writeln!(out, "  region {} (pid {} {state}, {} KiB, {how})", r.name, r.pid, r.size / 1024);
            match Region::attach(&r.id) {
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
    let snap = shmfab::internal::snapshot::region(reg);
    for e in &snap.endpoints {
        let _ = writeln!(
            out,
            "    endpoint {} (generation {}): {} sends queued or in flight, {} receives posted, {} unexpected, {} receives in progress; {} progress passes",
            e.index, e.generation, e.tx_queued, e.rx_posted, e.unexpected, e.rx_active, e.passes,
        );
        for r in &e.rings {
            let _ = writeln!(
                out,
                "      ring {} from {}: {} of {} cells in flight",
                r.slot,
                who(all, &r.from),
                r.in_flight,
                e.ring_cells
            );
        }
        if e.ovf_used != 0 || e.ovf_queued != 0 {
            let _ = writeln!(out, "      overflow queue: {} of {} entries", e.ovf_queued, e.ovf_cells);
        }
        let _ = writeln!(out, "      pool: {} of {} chunks in use", e.pool_in_use, e.pool_chunks);
    }
    for c in snap.counters.iter().filter(|c| c.value != 0 || c.err != 0) {
        let _ = writeln!(out, "    counter {}: {} (errors {})", c.index, c.value, c.err);
    }
}

fn boot(out: &mut String, r: &RegionInfo) {
    let path = if r.named { shmfab::internal::region::shm_path(&r.name) } else { r.id.path() };
    match shmfab::internal::snapshot::boot(&path) {
        Some(b) => {
            let why = if r.alive {
                "the job is starting or a rank never came"
            } else {
                "nobody is in it: a leftover of a job that died while starting; `shmfab clean` removes it"
            };
            let _ = writeln!(
                out,
                "  boot region {}: {} of {} ranks arrived, {} done ({why})",
                r.name, b.arrived, b.size, b.departed
            );
        }
        None => {
            let _ = writeln!(out, "  boot region {} (not initialised)", r.name);
        }
    }
}
