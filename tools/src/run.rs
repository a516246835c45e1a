//! `shmfab run -n N [--bind core|numa|none] -- PROGRAM ARGS`: the embedded
//! launcher, for machines without mpirun.
//!
//! Each rank gets `SHMFAB_RANK`, `SHMFAB_SIZE`, `SHMFAB_LOCAL_RANK` and a job
//! id of its own (`SHMFAB_JOB_ID`, unique per launch), and dies with the
//! launcher (PR_SET_PDEATHSIG). The launcher forwards SIGINT, SIGTERM, SIGHUP
//! and SIGQUIT to its ranks; when a rank fails (non-zero exit or a signal)
//! it stops the others (SIGTERM, then SIGKILL after a grace period); it
//! exits with the worst status of its ranks (a signal counts as 128 +
//! signal) and removes the job's regions from /dev/shm.

use shmfab::{Error, ErrorKind, Result};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// How ranks are pinned (`--bind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bind {
    /// Rank r on the hardware threads of core r mod ncores (hwloc).
    Core,
    /// Rank r on the CPUs of NUMA node r mod nnodes (hwloc).
    Numa,
    /// Not pinned.
    None,
}

static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALLED.store(sig, Ordering::SeqCst);
}

/// CPU lists of the NUMA nodes (from sysfs); one node of every CPU if sysfs
/// says nothing.
pub fn numa_nodes() -> Vec<Vec<usize>> {
    let mut nodes = Vec::new();
    for i in 0..1024 {
        let Ok(list) = std::fs::read_to_string(format!("/sys/devices/system/node/node{i}/cpulist")) else {
            if i > 0 {
                break;
            }
            continue;
        };
        nodes.push(parse_cpulist(list.trim()));
    }
    if nodes.is_empty() {
        nodes.push((0..crate::bench::ncpus()).collect());
    }
    nodes
}

/// Parses "0-3,8,10-11".
pub fn parse_cpulist(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<usize>(), b.parse::<usize>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.parse::<usize>().ok()),
        }
    }
    v
}

fn describe(st: std::process::ExitStatus) -> (i32, String) {
    match (st.code(), st.signal()) {
        (Some(c), _) => (c, format!("exited with status {c}")),
        (None, Some(s)) => (128 + s, format!("was killed by signal {s}")),
        _ => (1, "ended oddly".into()),
    }
}

/// Runs `argv` as `n` ranks; returns the launcher's exit code.
pub fn run(n: usize, bind: Bind, argv: &[String]) -> Result<i32> {
    if n == 0 || n > 4096 {
        return Err(Error::with(ErrorKind::Inval, "-n takes 1 to 4096 ranks"));
    }
    let Some((prog, args)) = argv.split_first() else {
        return Err(Error::with(ErrorKind::Inval, "nothing to run: shmfab run -n N -- PROGRAM [ARGS]"));
    };
    let me = std::process::id();
    let job = format!("run.{me}.{}", shmfab::internal::region::proc_start_time(me).unwrap_or(0));
    let launcher = me as libc::pid_t;
    // CPU sets from hwloc; sysfs if hwloc cannot say.
    let topo = crate::topo::discover().ok();
    let cpus: Vec<Vec<usize>> = match (bind, &topo) {
        (Bind::None, _) => Vec::new(),
        (Bind::Core, Some(t)) if !t.units(false).is_empty() => t.units(false),
        (Bind::Numa, Some(t)) if !t.units(true).is_empty() => t.units(true),
        (Bind::Core, _) => (0..crate::bench::ncpus()).map(|c| vec![c]).collect(),
        (Bind::Numa, _) => numa_nodes(),
    };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: on_signal only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let mut kids: Vec<Child> = Vec::with_capacity(n);
    for r in 0..n {
        let mut c = Command::new(prog);
        c.args(args)
            .env("SHMFAB_RANK", r.to_string())
            .env("SHMFAB_SIZE", n.to_string())
            .env("SHMFAB_LOCAL_RANK", r.to_string())
            .env("SHMFAB_JOB_ID", &job);
        let set: Vec<usize> = if cpus.is_empty() { Vec::new() } else { cpus[r % cpus.len()].clone() };
        // SAFETY: the closure runs in the child between fork and exec and
        // makes only async-signal-safe system calls (prctl, getppid, kill,
        // sched_setaffinity) on data prepared before the fork.
        unsafe {
            c.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != launcher {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                if !set.is_empty() {
                    let mut m: libc::cpu_set_t = std::mem::zeroed();
                    for &cpu in &set {
                        libc::CPU_SET(cpu, &mut m);
                    }
                    libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &m);
                }
                Ok(())
            });
        }
        match c.spawn() {
            Ok(k) => kids.push(k),
            Err(e) => {
                for k in kids.iter_mut() {
                    let _ = k.kill();
                    let _ = k.wait();
                }
                cleanup(&job);
                return Err(Error::with(ErrorKind::NoEnt, format!("cannot start {prog}: {e}")));
            }
        }
    }
    let pids: Vec<libc::pid_t> = kids.iter().map(|k| k.id() as libc::pid_t).collect();
    let mut status: Vec<Option<(i32, String)>> = vec![None; n];
    // Ranks still running when the launcher began stopping them: their
    // end is the launcher's doing and does not count in the exit code.
    let mut stopped = vec![false; n];
    let mut stopping: Option<Instant> = None;
    let mut killed = false;
    while status.iter().any(|s| s.is_none()) {
        let sig = SIGNALLED.swap(0, Ordering::SeqCst);
        if sig != 0 {
            for (k, s) in kids.iter().zip(&status) {
                if s.is_none() {
                    // SAFETY: kill on our own child's pid.
                    unsafe { libc::kill(k.id() as libc::pid_t, sig) };
                }
            }
        }
        for (r, k) in kids.iter_mut().enumerate() {
            if status[r].is_none() {
                if let Ok(Some(st)) = k.try_wait() {
                    let d = describe(st);
                    if d.0 != 0 && stopping.is_none() {
                        eprintln!("shmfab run: rank {r} (pid {}) {}; stopping the other ranks", k.id(), d.1);
                        stopping = Some(Instant::now());
                        for (r2, s2) in status.iter().enumerate() {
                            if s2.is_none() && r2 != r {
                                stopped[r2] = true;
                                // SAFETY: kill on our own child's pid (not yet reaped).
                                unsafe { libc::kill(pids[r2], libc::SIGTERM) };
                            }
                        }
                    }
                    status[r] = Some(d);
                }
            }
        }
        if let Some(t) = stopping {
            if !killed && t.elapsed() > Duration::from_secs(3) {
                for (k, s) in kids.iter_mut().zip(&status) {
                    if s.is_none() {
                        let _ = k.kill();
                    }
                }
                killed = true;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cleanup(&job);
    let ours = |c: i32| c == 128 + libc::SIGTERM || c == 128 + libc::SIGKILL;
    let worst = status
        .iter()
        .zip(&stopped)
        .filter_map(|(s, st)| s.as_ref().map(|s| (s.0, *st)))
        .filter(|(c, st)| !(*st && ours(*c)))
        .map(|(c, _)| c)
        .max();
    Ok(worst.unwrap_or(0))
}

fn cleanup(job: &str) {
    shmfab::internal::region::remove_job(shmfab::internal::region::job_hash(job));
    let _ = rustix::shm::unlink(shmfab::internal::launch::boot_name(job).as_str());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_parse() {
        assert_eq!(parse_cpulist("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpulist(""), Vec::<usize>::new());
        assert!(!numa_nodes().is_empty());
    }

    #[test]
    fn worst_exit_code_and_the_rest_stopped() {
        // Rank 1 fails at once; the others would sleep 30 s but are stopped.
        let argv: Vec<String> =
            ["sh", "-c", "if [ $SHMFAB_RANK = 1 ]; then exit 3; fi; sleep 30"].iter().map(|s| s.to_string()).collect();
        let t0 = Instant::now();
        let code = run(3, Bind::None, &argv).unwrap();
        assert_eq!(code, 3, "the failing rank's status; the ones the launcher stopped do not count");
        assert!(t0.elapsed() < Duration::from_secs(10));
        // Rank 3 fails first; the others, stopped by the launcher, do not
        // count; all succeeding is 0.
        let argv: Vec<String> =
            ["sh", "-c", "sleep 0.$((3 - SHMFAB_RANK)); exit $SHMFAB_RANK"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run(4, Bind::Core, &argv).unwrap(), 3);
        let argv: Vec<String> = ["sh", "-c", "exit 0"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run(4, Bind::Core, &argv).unwrap(), 0);
        let argv: Vec<String> =
            ["sh", "-c", "test -n \"$SHMFAB_JOB_ID\" && test $SHMFAB_SIZE = 2"].iter().map(|s| s.to_string()).collect();
        assert_eq!(run(2, Bind::Numa, &argv).unwrap(), 0);
        assert!(run(1, Bind::None, &["/nonexistent/prog".to_string()]).is_err());
    }
}
