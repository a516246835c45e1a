//! Who this process is in which job: rank, size, local rank and job id
//! from the launcher's environment, and a process's identity (pid plus
//! start time, so that a reused pid is not taken for the process).
//!
//! [`Launch::detect`] reads shmfab's own `shmfab run` (`SHMFAB_RANK`,
//! `SHMFAB_SIZE`, `SHMFAB_LOCAL_RANK`, `SHMFAB_JOB_ID`), Open MPI
//! (`OMPI_COMM_WORLD_*`, `PMIX_NAMESPACE`), MPICH Hydra (`PMI_RANK`,
//! `PMI_SIZE`, `MPI_LOCALRANKID`; Hydra gives no job id, so the node-local
//! job is named after the `hydra_pmi_proxy` that is every local rank's
//! parent) and Slurm (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`,
//! `SLURM_JOB_ID`, `SLURM_STEP_ID`). `SHMFAB_JOB_ID` always names the job if
//! set. Without a launcher a process is rank 0 of 1.
//!
//! A leaf: it uses nothing else of the crate, so the region code (which
//! names regions after the job) and the launch code (which builds the
//! `World` of a job) both use it without depending on each other.
//!
//! ```
//! use shmfab::internal::job::{Launch, Launcher};
//! let vars = [("OMPI_COMM_WORLD_RANK", "2"), ("OMPI_COMM_WORLD_SIZE", "4"),
//!             ("OMPI_COMM_WORLD_LOCAL_RANK", "2"), ("PMIX_NAMESPACE", "prterun-x-1@1")];
//! let l = Launch::from_vars(|k| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string())).unwrap();
//! assert_eq!((l.rank, l.size, l.local_rank, l.launcher), (2, 4, 2, Launcher::OpenMpi));
//! assert_eq!(l.job, "prterun-x-1@1");
//! ```

/// Which launcher started this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `shmfab run`.
    Shmfab,
    /// Open MPI's mpirun / prterun.
    OpenMpi,
    /// MPICH's Hydra (mpiexec.hydra), also Intel MPI's.
    Hydra,
    /// Slurm's srun.
    Slurm,
    /// No launcher: a job of one.
    Single,
}

/// This process's place in its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Rank, `0 .. size`.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
    /// Rank among the job's ranks on this node.
    pub local_rank: usize,
    /// The job id (ranks of one job agree on it; other jobs differ).
    pub job: String,
    /// Who launched us.
    pub launcher: Launcher,
}

/// A launcher's environment that does not make sense: what is wrong with
/// which variable (callers turn it into the crate's `Inval` error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobError(pub String);

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for JobError {}

fn num(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<Option<usize>, JobError> {
    match get(var) {
        None => Ok(None),
        Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| JobError(format!("{var}={v:?} is not a number"))),
    }
}

impl Launch {
    /// From this process's environment.
    pub fn detect() -> Result<Launch, JobError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From any variable source (`get(name)`), for tests and tools.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Launch, JobError> {
        let schemes: [(Launcher, &str, &str, &str); 4] = [
            (Launcher::Shmfab, "SHMFAB_RANK", "SHMFAB_SIZE", "SHMFAB_LOCAL_RANK"),
            (Launcher::OpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
            (Launcher::Hydra, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
            (Launcher::Slurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ];
        let mut found = None;
        for (l, rv, sv, lv) in schemes {
            if let Some(rank) = num(&get, rv)? {
                let size = num(&get, sv)?.ok_or_else(|| JobError(format!("{rv} is set but {sv} is not")))?;
                if size == 0 || rank >= size {
                    return Err(JobError(format!("{rv}={rank} is not below {sv}={size}")));
                }
                let local = num(&get, lv)?.unwrap_or(rank);
                found = Some((l, rank, size, local));
                break;
            }
        }
        let (launcher, rank, size, local_rank) = found.unwrap_or((Launcher::Single, 0, 1, 0));
        let job = match get("SHMFAB_JOB_ID") {
            Some(j) if !j.is_empty() => j,
            _ => match launcher {
                Launcher::OpenMpi => get("PMIX_NAMESPACE")
                    .or_else(|| get("OMPI_MCA_orte_ess_jobid"))
                    .ok_or_else(|| JobError("Open MPI launch without PMIX_NAMESPACE".into()))?,
                Launcher::Slurm => format!(
                    "slurm.{}.{}",
                    get("SLURM_JOB_ID").unwrap_or_default(),
                    get("SLURM_STEP_ID").unwrap_or_default()
                ),
                Launcher::Hydra => {
                    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32).unwrap_or(0);
                    format!("hydra.{ppid}.{}", proc_start_time(ppid).unwrap_or(0))
                }
                Launcher::Shmfab => return Err(JobError("SHMFAB_RANK is set but SHMFAB_JOB_ID is not".into())),
                Launcher::Single => format!("solo.{}", std::process::id()),
            },
        };
        Ok(Launch { rank, size, local_rank, job, launcher })
    }
}

/// The job id from the launcher's environment: `SHMFAB_JOB_ID`, Open MPI's
/// `PMIX_NAMESPACE`, Slurm's job and step, the Hydra proxy, else this
/// process alone (also when the environment does not make sense: the
/// error is reported by whoever joins a job, [`Launch::detect`]).
pub fn job_id() -> String {
    Launch::detect().map(|l| l.job).unwrap_or_else(|_| format!("solo.{}", std::process::id()))
}

/// State letter and start time (clock ticks since boot) of `pid`, from
/// /proc/PID/stat.
fn proc_stat(pid: u32) -> Option<(u8, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the last ')'.
    let mut rest = s[s.rfind(')')? + 1..].split_whitespace();
    // rest starts at field 3 (state); starttime is field 22.
    let state = *rest.next()?.as_bytes().first()?;
    Some((state, rest.nth(18)?.parse().ok()?))
}

/// Start time of `pid` in clock ticks since boot, from /proc/PID/stat.
pub fn proc_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|s| s.1)
}

/// Whether the process `pid` that started at `start_time` still lives. A
/// zombie (state Z, or X while it is reaped) is dead: it keeps its pid and
/// start time until its parent reaps it, but it will never answer again
/// (and its parent may be the very process waiting for it).
///
/// Pids mean nothing across PID namespaces: decisions that destroy
/// something (removing a region) use the region's lock instead
/// (`region::Region::alive`, `region::scan`); this check serves messages
/// and the ranks of one job, which share a namespace.
pub fn owner_alive(pid: u32, start_time: u64) -> bool {
    pid != 0 && proc_stat(pid).is_some_and(|(state, st)| st == start_time && state != b'Z' && state != b'X')
}

/// This process's PID namespace: the inode of /proc/self/ns/pid (0 when it
/// cannot be read). Pids mean the same only inside one namespace.
pub fn pid_ns() -> u64 {
    static NS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NS.get_or_init(|| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self/ns/pid").map_or(0, |m| m.ino())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(v: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| v.iter().find(|x| x.0 == k).map(|x| x.1.to_string())
    }

    #[test]
    fn detects_each_launcher() {
        let l = Launch::from_vars(vars(&[("SHMFAB_RANK", "1"), ("SHMFAB_SIZE", "3"), ("SHMFAB_JOB_ID", "j")])).unwrap();
        assert_eq!((l.rank, l.size, l.local_rank, l.launcher, l.job.as_str()), (1, 3, 1, Launcher::Shmfab, "j"));
        let l = Launch::from_vars(vars(&[("PMI_RANK", "0"), ("PMI_SIZE", "2"), ("MPI_LOCALRANKID", "0")])).unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (0, 2, Launcher::Hydra));
        assert!(l.job.starts_with("hydra."), "{}", l.job);
        let l = Launch::from_vars(vars(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (l.rank, l.size, l.local_rank, l.launcher, l.job.as_str()),
            (5, 8, 1, Launcher::Slurm, "slurm.77.0")
        );
        let l = Launch::from_vars(vars(&[])).unwrap();
        assert_eq!((l.rank, l.size, l.launcher), (0, 1, Launcher::Single));
        // SHMFAB_JOB_ID names the job whatever the launcher.
        let l = Launch::from_vars(vars(&[("PMI_RANK", "0"), ("PMI_SIZE", "1"), ("SHMFAB_JOB_ID", "x")])).unwrap();
        assert_eq!(l.job, "x");
    }

    #[test]
    fn bad_launch_variables_are_named() {
        let e = Launch::from_vars(vars(&[("OMPI_COMM_WORLD_RANK", "4"), ("OMPI_COMM_WORLD_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("OMPI_COMM_WORLD_RANK=4"), "{e}");
        let e = Launch::from_vars(vars(&[("PMI_RANK", "x")])).unwrap_err();
        assert!(e.to_string().contains("PMI_RANK"), "{e}");
        let e = Launch::from_vars(vars(&[("SLURM_PROCID", "0")])).unwrap_err();
        assert!(e.to_string().contains("SLURM_NTASKS"), "{e}");
    }

    #[test]
    fn start_time_of_self_is_known_and_reused_pid_is_not_alive() {
        let pid = std::process::id();
        let st = proc_start_time(pid).expect("own start time");
        assert!(owner_alive(pid, st));
        assert!(!owner_alive(pid, st + 1), "same pid, other start time: not the owner");
        assert!(!owner_alive(0, 0));
    }

    #[test]
    fn a_zombie_is_dead() {
        // A child that exits and is not reaped yet stays a zombie with its
        // pid and start time: it must count as dead.
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().expect("spawn sleep");
        let pid = child.id();
        let st = proc_start_time(pid).expect("child's start time");
        assert!(owner_alive(pid, st), "a running child is alive");
        let t0 = std::time::Instant::now();
        while proc_stat(pid).map(|s| s.0) != Some(b'Z') {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the child never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(proc_start_time(pid), Some(st), "a zombie keeps its start time");
        assert!(!owner_alive(pid, st), "a zombie is dead");
        child.wait().unwrap();
    }
}
