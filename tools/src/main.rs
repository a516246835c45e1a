//! The `shmfab` command: benchmarks between two processes it starts itself,
//! the side-by-side comparison with the installed peers, the embedded
//! launcher, a live job's state, region cleanup and facts about the node.
//! Arguments are parsed by clap (usage errors exit with status 2, other
//! failures with 1); figures are written as JSON by serde.

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use shmfab_tools::bench::{self, Figure, Link, RmaMem};
use shmfab_tools::status::Status;
use std::path::{Path, PathBuf};

/// Window of the message-rate test: osu_mbw_mr's default.
const RATE_WINDOW: usize = 64;

const DEFAULT_SIZES: [usize; 9] = [8, 64, 1024, 4096, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];

/// shmfab: shared-memory communication between processes of one node.
#[derive(Debug, Parser)]
#[command(name = "shmfab", version, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start N ranks of PROGRAM (shmfab's own launcher; ranks join with shmfab::World)
    Run(RunArgs),
    /// Two processes (this one and a peer it starts, or a launcher's two
    /// ranks) over shmfab: half round trip, bandwidth, message rate
    Bench(BenchArgs),
    /// shmfab, the raw shared-memory floor, Open MPI and UCX (osu-style
    /// program at --osu, over Open MPI's vader BTL and its pml ucx) and
    /// libfabric shm (fi_pingpong) side by side, with shmfab's ratios; the
    /// systems take turns for --rounds rounds, each figure the median
    Compare(CompareArgs),
    /// What a live job's regions hold (run it when a job hangs)
    Inspect {
        /// A job id or its 8-hex hash (default: all of this user's jobs)
        job: Option<String>,
    },
    /// Remove this user's regions whose owners are dead
    Clean {
        /// Only list them
        #[arg(long)]
        dry_run: bool,
    },
    /// Version, layout, thresholds in force, CMA, /dev/shm (or SHMFAB_SHM_DIR), topology, and
    /// memory per rank for N ranks
    Info(InfoArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Ranks to start (1 to 4096)
    #[arg(short = 'n', long = "np", value_name = "N", value_parser = in_range(1, 4096))]
    n: usize,
    /// How ranks are pinned
    #[arg(long, value_enum, default_value_t = shmfab_tools::run::Bind::None)]
    bind: shmfab_tools::run::Bind,
    /// The program and its arguments, after --
    #[arg(last = true, required = true, value_name = "PROGRAM")]
    program: Vec<String>,
}

/// What `shmfab bench` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum What {
    /// Half round trip by size
    Pingpong,
    /// Streaming bandwidth by size
    Bw,
    /// Message rate (sizes up to 64 B; 8 B unless --sizes says)
    Msgrate,
    /// All three
    All,
    /// Wake-up latency of a receiver asleep in sread, and a blocked rank's CPU
    Wakeup,
    /// One-sided: put and get latency and bandwidth by size into the
    /// peer's shared heap and into its ordinary registered memory (single
    /// copy), and the fetch-add latency and two-rank rate on one word
    Rma,
    /// The raw shared-memory floor (no shmfab in it): at 8 B, briefly,
    /// where the two CPUs sit now (`scripts/ab.sh` labels its rounds with
    /// it); with --sizes, the half round trip of each size through shared
    /// memory alone (above a page, two copies overlapped in 4 KiB pieces)
    Raw,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// What to measure
    #[arg(value_enum, default_value_t = What::All)]
    what: What,
    #[command(flatten)]
    sizes: SizesArg,
    /// Write the figures to FILE as JSON
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Add the installed peers side by side (as shmfab compare)
    #[arg(long)]
    compare: bool,
    /// With --compare: rounds the systems take turns for (1 to 50)
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = in_range(1, 50), requires = "compare")]
    rounds: usize,
    /// With --compare: the osu-style MPI program (default: built here with mpicc)
    #[arg(long, value_name = "PATH", requires = "compare")]
    osu: Option<PathBuf>,
    /// With rma: operations per run (default: by size, about 128 MiB
    /// moved, 20 to 100000; fetch-add: 200000 per rank); with raw: round
    /// trips per size (default: as compare takes them)
    #[arg(long, value_name = "N", value_parser = in_range(1, 10_000_000))]
    iters: Option<usize>,
}

/// Which part of `compare` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Part {
    /// Two-sided: half round trip, bandwidth, message rate
    P2p,
    /// One-sided: put, get, fetch-add
    Rma,
    /// Collectives: barrier and allreduce latency on 2, 4 and 8 ranks
    /// (in the default set when examples/coll_bench is built)
    Coll,
}

#[derive(Clone, Debug, Args)]
struct CompareArgs {
    #[command(flatten)]
    sizes: SizesArg,
    /// Write the figures of every system to FILE as JSON
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The osu-style MPI program (without it, Open MPI and UCX are left out)
    #[arg(long, value_name = "PATH")]
    osu: Option<PathBuf>,
    /// Draw half round trip and bandwidth against size (log-log, one line
    /// per system) to FILE as SVG
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Rounds the systems take turns for (1 to 50)
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = in_range(1, 50))]
    rounds: usize,
    /// The directory holding shmfab's libfabric provider (libshmfab-fi.so,
    /// as scripts/fi-build.sh makes it): fi_pingpong over it joins the
    /// comparison
    #[arg(long, value_name = "DIR")]
    fi_provider: Option<PathBuf>,
    /// The one-sided MPI program (mpi_tests/osu_rma.c built with mpicc;
    /// without it, Open MPI's one-sided figures are left out)
    #[arg(long, value_name = "PATH")]
    osu_rma: Option<PathBuf>,
    /// Run only this part (default: all three; coll when it can run)
    #[arg(long, value_enum, value_name = "PART")]
    only: Option<Part>,
    /// With --only coll: shmfab's collective benchmark (default:
    /// examples/coll_bench beside this executable, as `cargo build
    /// --release --example coll_bench` makes it)
    #[arg(long, value_name = "PATH")]
    coll_bench: Option<PathBuf>,
    /// With --only coll: the collective MPI program (mpi_tests/osu_coll.c
    /// built with mpicc; without it, Open MPI is left out)
    #[arg(long, value_name = "PATH")]
    osu_coll: Option<PathBuf>,
}

#[derive(Clone, Debug, Args)]
struct SizesArg {
    /// Message sizes in bytes, with k or m for KiB or MiB [default: 8,64,1k,4k,16k,64k,256k,1m,4m]
    #[arg(long, value_name = "SIZES", value_delimiter = ',', value_parser = bench_size)]
    sizes: Option<Vec<usize>>,
}

impl SizesArg {
    fn get(&self) -> Vec<usize> {
        self.sizes.clone().unwrap_or_else(|| DEFAULT_SIZES.to_vec())
    }
}

#[derive(Debug, Args)]
struct InfoArgs {
    /// Rank counts to show memory per rank for (1 to 65536 each)
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_values_t = [2, 8, 64, 256], value_parser = in_range(1, 1 << 16))]
    ranks: Vec<usize>,
    /// Depth of the shared receive queue (per-peer queues get half)
    #[arg(long, value_name = "D", default_value_t = 128, value_parser = in_range(2, 1 << 30))]
    depth: usize,
    /// Receive buffer size, with k or m for KiB or MiB
    #[arg(long, value_name = "BYTES", default_value = "4k", value_parser = buf_size)]
    buf: usize,
}

/// A byte count: decimal digits with an optional `k`/`K` (KiB) or `m`/`M`
/// (MiB) suffix. A count that does not fit in a usize is an error, never a
/// wrapped value.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1usize << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a size: digits, optionally followed by k or m (8, 64k, 1m)"));
    }
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(|| format!("{s:?} is too large: sizes go up to {} bytes", usize::MAX))
}

/// A message size for the benchmarks: at most [`bench::MAX_SIZE`].
fn bench_size(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    if n > bench::MAX_SIZE {
        return Err(format!("size {n} is above the {} limit", bench::MAX_SIZE));
    }
    Ok(n)
}

/// Largest receive buffer `info --buf` takes: 1 GiB.
const MAX_BUF: usize = 1 << 30;

/// A buffer size: 1 byte to [`MAX_BUF`].
fn buf_size(s: &str) -> Result<usize, String> {
    match parse_size(s)? {
        n if (1..=MAX_BUF).contains(&n) => Ok(n),
        n => Err(format!("a buffer holds 1 to {MAX_BUF} bytes, not {n}")),
    }
}

/// Whether every figure `info` prints for these ranks, depth and buffer
/// size fits in a usize (computed wide, so nothing wraps on the way).
fn footprint_fits(cfg: &shmfab::Config, o: &InfoArgs) -> Result<(), String> {
    let w = |v: usize| v as u128;
    let section = w(cfg.geometry.section_size());
    let base = w(shm_layout::eps_offset(cfg.max_counters));
    let peer = w(shmfab::internal::footprint::peer_bytes());
    for &n in &o.ranks {
        let peers = w(n.saturating_sub(1)).max(1);
        let bufs = peers * w(o.depth).max(w(o.depth / 2).max(1)) * w(o.buf);
        let per_rank = base + peers * section + peers * peers * peer + bufs;
        if w(n) * per_rank > w(usize::MAX) {
            return Err(format!(
                "--ranks {n} --depth {} --buf {}: memory per rank would not fit in 64 bits",
                o.depth, o.buf
            ));
        }
    }
    Ok(())
}

/// Checks, before anything runs, that the figures can be written to
/// `path`: it is opened for writing (and created, then removed again, when
/// it did not exist).
fn check_json_path(path: &Path) -> Result<(), String> {
    check_out_path("--json", path)
}

/// As [`check_json_path`], for the file of option `flag`.
fn check_out_path(flag: &str, path: &Path) -> Result<(), String> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("{flag} {}: cannot write it: {e}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// A parser of whole numbers in `lo..=hi`.
fn in_range(lo: usize, hi: usize) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |s: &str| match s.trim().parse::<usize>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        Ok(n) => Err(format!("{n} is not in {lo}..={hi}")),
        Err(_) if !s.trim().is_empty() && s.trim().bytes().all(|b| b.is_ascii_digit()) => {
            Err(format!("{s:?} is too large: {lo}..={hi}"))
        }
        Err(_) => Err(format!("{s:?} is not a number ({lo}..={hi})")),
    }
}

fn main() {
    if std::env::var_os(bench::PEER_ENV).is_some() {
        std::process::exit(bench::peer_main());
    }
    if std::env::var_os("SHMFAB_RAW_PEER").is_some() {
        std::process::exit(bench::raw_peer_main());
    }
    let cli = Cli::parse();
    // Settings first: a bad SHMFAB_* variable is a usage error (status 2),
    // one line naming it, before anything runs.
    let cfg = match &cli.cmd {
        Cmd::Inspect { .. } | Cmd::Clean { .. } => None,
        _ => match settings() {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("shmfab: {e}");
                std::process::exit(2);
            }
        },
    };
    let r = match cli.cmd {
        Cmd::Run(a) => cmd_run(&a),
        Cmd::Bench(a) => cmd_bench(&a),
        Cmd::Compare(a) => cmd_compare(&a),
        Cmd::Inspect { job } => cmd_inspect(job.as_deref()),
        Cmd::Clean { dry_run } => cmd_clean(dry_run),
        Cmd::Info(a) => {
            let cfg = cfg.unwrap_or_default();
            if let Err(e) = footprint_fits(&cfg, &a) {
                eprintln!("shmfab: {e}");
                std::process::exit(2);
            }
            cmd_info(&a, cfg)
        }
    };
    if let Err(e) = r {
        eprintln!("shmfab: {e}");
        std::process::exit(1);
    }
}

/// Most seconds `SHMFAB_IDLE_SECS` (the idle period of `bench wakeup`) takes.
const MAX_IDLE_SECS: u64 = 3600;

/// The settings in force: every `SHMFAB_*` variable the library reads, and
/// the command's own (`SHMFAB_IDLE_SECS`, `SHMFAB_BENCH_CPU`), checked. The
/// error is the one line naming the bad variable and its range.
fn settings() -> Result<shmfab::Config, String> {
    let line = |e: shmfab::Error| e.detail().map_or_else(|| e.to_string(), str::to_string);
    let cfg = shmfab::proto::Config::from_env().map_err(line)?;
    idle_secs().map_err(line)?;
    bench::cpu_from_env().map_err(line)?;
    Ok(cfg)
}

/// `SHMFAB_IDLE_SECS`: 1 to [`MAX_IDLE_SECS`], default 10.
fn idle_secs() -> shmfab::Result<u64> {
    let get = shmfab::proto::process_env;
    let v = shmfab::proto::parse_env(&get, "SHMFAB_IDLE_SECS", 1, MAX_IDLE_SECS, shmfab::proto::Rule::Any)?;
    Ok(v.unwrap_or(10))
}

fn cmd_run(a: &RunArgs) -> Result<(), String> {
    let code = shmfab_tools::run::run(a.n, a.bind, &a.program).map_err(|e| e.to_string())?;
    std::process::exit(code);
}

fn cmd_inspect(job: Option<&str>) -> Result<(), String> {
    let job = job.map(shmfab_tools::inspect::job_arg);
    print!("{}", shmfab_tools::inspect::inspect(job).map_err(|e| e.to_string())?);
    Ok(())
}

fn cmd_clean(dry_run: bool) -> Result<(), String> {
    // Where the regions are (SHMFAB_SHM_DIR or /dev/shm); an unusable
    // setting is an error, not "nothing to clean".
    shmfab::internal::region::shm_dir().map_err(|e| e.to_string())?;
    let dead = shmfab::internal::region::clean_dead(dry_run);
    for r in &dead {
        let verb = if dry_run { "would remove" } else { "removed" };
        println!("{verb} {} (owner pid {} dead, {} bytes)", r.name, r.pid, r.size);
    }
    if dead.is_empty() {
        println!("no regions of dead owners");
    }
    Ok(())
}

fn exe() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))
}

/// The two ranks of a launcher (mpirun, shmfab run -n 2), if this process
/// is one of them: rank 0 measures, rank 1 serves it (and exits here).
fn launched_pair() -> Result<Option<shmfab::World>, String> {
    let l = shmfab::internal::job::Launch::detect().map_err(|e| e.to_string())?;
    if l.launcher == shmfab::Launcher::Single {
        return Ok(None);
    }
    if l.size != 2 {
        return Err(format!("shmfab bench under a launcher needs 2 ranks, not {}", l.size));
    }
    let w = shmfab::World::init().map_err(|e| e.to_string())?;
    if w.rank == 1 {
        let code = match bench::serve_world(&w) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("shmfab bench (rank 1): {e}");
                1
            }
        };
        std::process::exit(code);
    }
    Ok(Some(w))
}

/// Which of shmfab's figures to take.
#[derive(Clone, Copy, Debug)]
struct Measures {
    lat: bool,
    bw: bool,
    rate: bool,
}

/// shmfab's own figures for `sizes`, one progress step per size.
fn measure(sizes: &[usize], m: Measures, status: &mut Status) -> Result<Vec<Figure>, String> {
    let world = launched_pair()?;
    let mut link = match &world {
        Some(w) => Link::with_world(w),
        None => Link::spawn(&exe()?, &[]),
    }
    .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for &size in sizes {
        let mut f = Figure { size, ..Default::default() };
        status.step(&format!("shmfab, {}", bytes(size)));
        if m.lat {
            f.half_rtt_us = Some(link.pingpong(size, bench::iters_for(size)).map_err(|e| e.to_string())?);
        }
        if m.bw {
            let w = Link::window_for(size);
            let it = (bench::iters_for(size) / w).max(10);
            f.bw_gbs = Some(link.stream(size, w, it).map_err(|e| e.to_string())?.0);
        }
        if m.rate && size <= 64 {
            f.mmsgs = Some(link.stream(size, RATE_WINDOW, 2000).map_err(|e| e.to_string())?.1);
        }
        out.push(f);
    }
    link.quit().map_err(|e| e.to_string())?;
    Ok(out)
}

/// A size for people: `8 B`, `64 KiB`, `4 MiB`.
fn bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

fn fmt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// The osu-style MPI program, built here with mpicc when none was given.
const OSU_SOURCE: &str = include_str!("../../mpi_tests/osu_style.c");
const OSU_RMA_SOURCE: &str = include_str!("../../mpi_tests/osu_rma.c");

fn osu_binary(given: Option<&Path>) -> Option<PathBuf> {
    mpi_binary(given, "osu_style", OSU_SOURCE)
}

/// `given`, or the MPI program `source` built here with mpicc as `name`.
fn mpi_binary(given: Option<&Path>, name: &str, source: &str) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    let dir = std::env::temp_dir().join(format!("shmfab-osu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, source).ok()?;
    let ok = std::process::Command::new("mpicc").args(["-O2", "-o"]).arg(&bin).arg(&src).status().ok()?.success();
    if !ok {
        eprintln!("mpicc failed: Open MPI left out of the comparison");
        return None;
    }
    Some(bin)
}

fn cmd_bench(a: &BenchArgs) -> Result<(), String> {
    if let Some(p) = &a.json {
        check_json_path(p)?;
    }
    if a.compare {
        let osu = osu_binary(a.osu.as_deref());
        let osu_rma = mpi_binary(None, "osu_rma", OSU_RMA_SOURCE);
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT", "1");
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let c = CompareArgs {
            sizes: a.sizes.clone(),
            json: a.json.clone(),
            osu,
            rounds: a.rounds,
            plot: None,
            fi_provider: None,
            osu_rma,
            only: None,
            coll_bench: None,
            osu_coll: None,
        };
        return cmd_compare(&c);
    }
    let m = match a.what {
        What::Wakeup => return cmd_wakeup(a),
        What::Rma => return cmd_bench_rma(a),
        What::Raw => {
            // 8 B alone by default, briefly (scripts/ab.sh's probe); the
            // sizes asked for, each as long as a compare run takes it.
            let exe = exe()?;
            for size in a.sizes.sizes.clone().unwrap_or_else(|| vec![8]) {
                let iters = match (a.iters, &a.sizes.sizes) {
                    (Some(n), _) => n,
                    (None, Some(_)) => bench::iters_for(size),
                    (None, None) => PROBE_ITERS,
                };
                let us = bench::raw_pingpong(&exe, &[], size, iters).map_err(|e| e.to_string())?;
                println!("raw {size} B half round trip {us:.3} us");
            }
            return Ok(());
        }
        What::Pingpong => Measures { lat: true, bw: false, rate: false },
        What::Bw => Measures { lat: false, bw: true, rate: false },
        What::Msgrate => Measures { lat: false, bw: false, rate: true },
        What::All => Measures { lat: true, bw: true, rate: true },
    };
    let sizes = match (&a.sizes.sizes, a.what) {
        (None, What::Msgrate) => vec![8],
        _ => a.sizes.get(),
    };
    println!("shmfab {} between two processes ({} CPUs)", env!("CARGO_PKG_VERSION"), bench::ncpus());
    let mut status = Status::new(sizes.len());
    let figs = measure(&sizes, m, &mut status)?;
    status.finish();
    println!("{:>10} {:>14} {:>12} {:>12}", "size (B)", "half RTT (us)", "bw (GB/s)", "Mmsg/s");
    for f in &figs {
        println!("{:>10} {:>14} {:>12} {:>12}", f.size, fmt(f.half_rtt_us, 3), fmt(f.bw_gbs, 2), fmt(f.mmsgs, 2));
    }
    if let Some(p) = &a.json {
        write_json(p, &rows(&[("shmfab", &figs)]))?;
    }
    Ok(())
}

/// What `shmfab bench wakeup --json` writes.
#[derive(Debug, Serialize)]
struct WakeupJson {
    shmfab_wake_us: f64,
    raw_futex_wake_us: f64,
    idle_cpu_percent: f64,
}

/// Wake-up latency of a receiver asleep in sread against a raw futex wake
/// between two processes, and the CPU an idle blocked rank uses.
fn cmd_wakeup(a: &BenchArgs) -> Result<(), String> {
    let tries = 200;
    let gap = std::time::Duration::from_millis(2);
    let mut link = Link::spawn(&exe()?, &[]).map_err(|e| e.to_string())?;
    let ours = bench::median(link.wakeups(tries, gap).map_err(|e| e.to_string())?);
    let secs = idle_secs().map_err(|e| e.to_string())?;
    eprintln!("  idle rank for {secs} s ...");
    let idle = link.idle_cpu(std::time::Duration::from_secs(secs)).map_err(|e| e.to_string())?;
    link.quit().map_err(|e| e.to_string())?;
    let raw = bench::median(bench::raw_futex_wakeups(&exe()?, &[], tries, gap).map_err(|e| e.to_string())?);
    println!("wake-up of a receiver asleep in sread (median of {tries}): {ours:.2} us");
    println!(
        "raw futex wake between two processes (median of {tries}): {raw:.2} us  (shmfab / raw: {:.2}x)",
        ours / raw
    );
    println!("CPU of a rank blocked in sread on an idle CQ for {secs} s: {idle:.3} % of a core");
    if let Some(p) = &a.json {
        let w = WakeupJson {
            shmfab_wake_us: round_to(ours, 3),
            raw_futex_wake_us: round_to(raw, 3),
            idle_cpu_percent: round_to(idle, 4),
        };
        write_json(p, &w)?;
    }
    Ok(())
}

/// shmfab's one-sided figures: put and get by size into the peer's
/// shared heap and into its ordinary registered memory, and fetch-add.
#[derive(Clone, Debug)]
struct OursRma {
    /// Put heap, get heap, put ordinary memory, get ordinary memory.
    figs: [Vec<bench::RmaFigure>; 4],
    /// The path each took ([`bench::rma_path`]).
    paths: [&'static str; 4],
    fadd: bench::RmaFigure,
    fadd_path: &'static str,
    /// The fetch-adds again, both ranks through a [`shmfab::HeapTarget`].
    fadd_handle: Option<bench::RmaFigure>,
    /// 8 B on the heap in the forms a one-sided MPI layer completes with.
    forms: Option<bench::FlushForms>,
}

/// Measures [`OursRma`] between this process and a peer it starts
/// (`iters`: operations per run instead of [`bench::rma_iters`] and
/// [`bench::FADD_OPS`]).
fn measure_rma(sizes: &[usize], iters: Option<usize>, st: &mut Status) -> Result<OursRma, String> {
    let e = |e: shmfab::Error| e.to_string();
    let mut link = Link::spawn(&exe()?, &[]).map_err(e)?;
    let len = sizes.iter().copied().max().unwrap_or(8).max(8);
    link.rma_setup(len).map_err(e)?;
    let mut out = OursRma {
        figs: Default::default(),
        paths: ["-"; 4],
        fadd: bench::RmaFigure::default(),
        fadd_path: "-",
        fadd_handle: None,
        forms: None,
    };
    let mut seed = 0;
    for &size in sizes {
        st.step(&format!("shmfab one-sided, {}", bytes(size)));
        let n = iters.unwrap_or_else(|| bench::rma_iters(size));
        for (k, (put, mem)) in
            [(true, RmaMem::Heap), (false, RmaMem::Heap), (true, RmaMem::User), (false, RmaMem::User)]
                .into_iter()
                .enumerate()
        {
            seed += 1;
            let (f, path) = link.rma_op(put, mem, size, seed, n).map_err(|x| {
                format!("{} {} of {size} bytes: {x}", if put { "put" } else { "get" }, rma_mem_name(mem))
            })?;
            out.figs[k].push(f);
            out.paths[k] = path;
        }
    }
    st.step("shmfab fetch-add");
    let (f, path) = link.fetch_add(iters.unwrap_or(bench::FADD_OPS), false).map_err(|x| format!("fetch-add: {x}"))?;
    out.fadd = f;
    out.fadd_path = path;
    let (f, _) = link
        .fetch_add(iters.unwrap_or(bench::FADD_OPS), true)
        .map_err(|x| format!("fetch-add through a HeapTarget: {x}"))?;
    out.fadd_handle = Some(f);
    st.step("shmfab 8 B flushed as an MPI layer would");
    let n = iters.unwrap_or_else(|| bench::rma_iters(8));
    out.forms = Some(link.rma_flush_forms(n, seed + 1).map_err(|x| format!("flush forms: {x}"))?);
    link.quit().map_err(e)?;
    Ok(out)
}

fn rma_mem_name(m: RmaMem) -> &'static str {
    match m {
        RmaMem::Heap => "into the shared heap",
        RmaMem::User => "into ordinary registered memory",
    }
}

/// `shmfab bench rma`: shmfab's one-sided figures alone.
fn cmd_bench_rma(a: &BenchArgs) -> Result<(), String> {
    let l = shmfab::internal::job::Launch::detect().map_err(|e| e.to_string())?;
    if l.launcher != shmfab::Launcher::Single {
        return Err("shmfab bench rma starts its own peer: run it without a launcher".into());
    }
    let sizes = a.sizes.get();
    println!("shmfab {} one-sided, between two processes ({} CPUs)", env!("CARGO_PKG_VERSION"), bench::ncpus());
    let mut st = Status::new(sizes.len() + 2);
    let probe = placement_probe(&exe()?);
    let ours = measure_rma(&sizes, a.iters, &mut st)?;
    st.finish();
    println!(
        "latency: one operation, then its completion read from the CQ (a put's data is in the target's memory, a get's here)"
    );
    println!(
        "{:>8} | {:>9} {:>9} {:>9} {:>9} | {:>8} {:>8} {:>8} {:>8}",
        "size", "put heap", "get heap", "put user", "get user", "put heap", "get heap", "put user", "get user"
    );
    println!("{:>8} | {:^39} | {:^35}", "(bytes)", "latency (us)", "bandwidth (GB/s)");
    for (i, size) in sizes.iter().enumerate() {
        let f = |k: usize| ours.figs[k][i];
        println!(
            "{:>8} | {:>9} {:>9} {:>9} {:>9} | {:>8} {:>8} {:>8} {:>8}",
            size,
            fmt(f(0).latency_us, 3),
            fmt(f(1).latency_us, 3),
            fmt(f(2).latency_us, 3),
            fmt(f(3).latency_us, 3),
            fmt(f(0).bw_gbs, 2),
            fmt(f(1).bw_gbs, 2),
            fmt(f(2).bw_gbs, 2),
            fmt(f(3).bw_gbs, 2),
        );
    }
    println!(
        "paths (put/get): shared heap {}/{}, ordinary registered memory {}/{}",
        ours.paths[0], ours.paths[1], ours.paths[2], ours.paths[3]
    );
    println!(
        "fetch-add (8 B, u64 SUM, {}): {} us one rank alone, {} Mops/s two ranks on the one word",
        ours.fadd_path,
        fmt(ours.fadd.latency_us, 3),
        fmt(ours.fadd.mops, 2)
    );
    if let Some(f) = ours.forms {
        println!(
            "8 B on the heap, completed as an MPI one-sided layer would (every shmfab RMA is done when its call \
             returns): put by inject_write {} us; with a transmit counter read until it counts: put {} us, get {} us, \
             fetch-add {} us",
            fmt(Some(f.put_inject_us), 3),
            fmt(Some(f.put_cntr_us), 3),
            fmt(Some(f.get_cntr_us), 3),
            fmt(Some(f.fadd_cntr_us), 3)
        );
        println!(
            "8 B through a HeapTarget (registration resolved once, as an MPI window; every check kept, done when \
             the call returns): put {} us, fetch-add {} us one rank alone, {} Mops/s two ranks on the one word",
            fmt(Some(f.put_handle_us), 3),
            fmt(Some(f.fadd_handle_us), 3),
            fmt(ours.fadd_handle.and_then(|h| h.mops), 2)
        );
    }
    match bench::raw_fetch_adds(&exe()?, &[], a.iters.unwrap_or(bench::FADD_OPS)) {
        // Three significant digits at least: a run descheduled for a
        // time slice on a loaded machine is slow, never 0.
        Ok(m) => println!(
            "raw floor of the fetch-add rate: two processes doing lock xadd on one word, {:.*} Mops/s",
            (2 - m.log10().floor() as i64).clamp(2, 9) as usize,
            m
        ),
        Err(e) => println!("raw fetch-add floor: {e}"),
    }
    if let Some(p) = probe {
        println!("raw floor {p:.3} us at 8 B (placement probe, before the run)");
    }
    if let Some(p) = &a.json {
        let rows = rma_rows(&ours_rma_named(&ours), Placement::All);
        write_json(p, &rows)?;
    }
    Ok(())
}

/// The one-sided systems of `compare`: (JSON name, index of the probe
/// group: 0 shmfab, 1 Open MPI's default osc, 2 Open MPI with osc sm).
const RMA_SYSTEMS: [(&str, usize); 18] = [
    ("shmfab-put", 0),
    ("shmfab-get", 0),
    ("shmfab-put-cma", 0),
    ("shmfab-get-cma", 0),
    ("shmfab-fetch-add", 0),
    ("openmpi-put", 1),
    ("openmpi-get", 1),
    ("openmpi-fetch-add", 1),
    ("openmpi-osc-sm-put", 2),
    ("openmpi-osc-sm-get", 2),
    ("openmpi-osc-sm-fetch-add", 2),
    ("raw-fetch-add", 0),
    ("shmfab-put-inject", 0),
    ("shmfab-put-cntr", 0),
    ("shmfab-get-cntr", 0),
    ("shmfab-fetch-add-cntr", 0),
    ("shmfab-put-handle", 0),
    ("shmfab-fetch-add-handle", 0),
];

/// Index in [`RMA_SYSTEMS`] of each system with one figure at 8 B: the
/// fetch-adds (shmfab's, Open MPI's two, and the raw floor: two
/// processes doing bare `lock xadd`s on one shared word), then shmfab's
/// 8 B forms of [`bench::FlushForms`] and its `HeapTarget` rows.
const RMA_FADD: [usize; 10] = [4, 7, 10, 11, 12, 13, 14, 15, 16, 17];

/// One round of the one-sided systems: each system's run (its figures
/// as [`Figure`]s: latency in `half_rtt_us`, Mops/s in `mmsgs`; the
/// fetch-add systems have one, at 8 B), and the path or component each
/// took.
struct RmaRound {
    runs: Vec<Run>,
    paths: Vec<String>,
}

fn as_figure(f: &bench::RmaFigure) -> Figure {
    Figure { size: f.size, half_rtt_us: f.latency_us, bw_gbs: f.bw_gbs, mmsgs: f.mops }
}

/// `shmfab compare`'s one-sided round: shmfab, Open MPI with the osc
/// component it picks, and Open MPI with osc sm, each after a placement
/// probe.
fn rma_round(o: &CompareArgs, sizes: &[usize], exe: &Path, st: &mut Status) -> Result<RmaRound, String> {
    let n = RMA_SYSTEMS.len();
    let mut runs: Vec<Run> = (0..n)
        .map(|k| {
            let len = if RMA_FADD.contains(&k) { 1 } else { sizes.len() };
            Run { probes: vec![None; len], after: Vec::new(), figs: Vec::new() }
        })
        .collect();
    let mut paths = vec![String::new(); n];
    let mut probes = [None; 3];
    probes[0] = placement_probe_pair(exe);
    st.say("measuring shmfab one-sided ...");
    match measure_rma(sizes, None, st) {
        Ok(ours) => {
            for k in 0..4 {
                runs[k].figs = ours.figs[k].iter().map(as_figure).collect();
                paths[k] = ours.paths[k].to_string();
            }
            runs[4].figs = vec![as_figure(&ours.fadd)];
            paths[4] = ours.fadd_path.to_string();
            for (k, f) in forms_figures(&ours) {
                runs[k].figs = vec![f];
                paths[k] = "heap".to_string();
            }
            if let Some(f) = &ours.fadd_handle {
                runs[17].figs = vec![as_figure(f)];
                paths[17] = "heap".to_string();
            }
        }
        Err(e) => st.warn(&format!("shmfab one-sided: {e}")),
    }
    match bench::raw_fetch_adds(exe, &[], bench::FADD_OPS) {
        Ok(m) => runs[11].figs = vec![Figure { size: 8, mmsgs: Some(m), ..Default::default() }],
        Err(e) => st.warn(&format!("raw fetch-add floor: {e}")),
    }
    paths[11] = "lock xadd".to_string();
    if let Some(bin) = &o.osu_rma {
        for (g, osc) in [(1, None), (2, Some("sm"))] {
            probes[g] = placement_probe_pair(exe);
            let name = osc.map_or("the osc component it picks".to_string(), |c| format!("osc {c}"));
            st.say(&format!("measuring Open MPI one-sided ({name}) ..."));
            st.step(&format!("Open MPI one-sided ({name})"));
            match bench::openmpi_rma(bin, sizes, osc) {
                Ok(r) => {
                    let base = if g == 1 { 5 } else { 8 };
                    runs[base].figs = r.put.iter().map(as_figure).collect();
                    runs[base + 1].figs = r.get.iter().map(as_figure).collect();
                    runs[base + 2].figs = vec![as_figure(&r.fadd)];
                    for p in &mut paths[base..base + 3] {
                        *p = format!("osc {}", r.osc);
                    }
                }
                Err(e) => st.warn(&format!("Open MPI one-sided ({name}): {e}")),
            }
        }
    }
    for (k, r) in runs.iter_mut().enumerate() {
        let p = probes[RMA_SYSTEMS[k].1];
        r.probes.iter_mut().for_each(|x| *x = p);
        if r.figs.is_empty() {
            r.figs = if RMA_FADD.contains(&k) { none_for(&[8]) } else { none_for(sizes) };
        }
    }
    Ok(RmaRound { runs, paths })
}

/// Progress steps of one one-sided round.
fn rma_steps(sizes: &[usize], osu_rma: bool) -> usize {
    sizes.len() + 2 + 2 * usize::from(osu_rma)
}

/// The medians of the one-sided systems' figures in one placement: by
/// size for put and get, at 8 B for fetch-add; and the median probe.
fn rma_placement_figures(
    rounds: &[RmaRound],
    sizes: &[usize],
    pl: Placement,
    split: &Splits,
) -> (Vec<Vec<Figure>>, Option<Probe>) {
    let mut probes = Vec::new();
    let figs = (0..RMA_SYSTEMS.len())
        .map(|k| {
            let runs: Vec<Run> = rounds.iter().map(|r| r.runs[k].clone()).collect();
            let s: &[usize] = if RMA_FADD.contains(&k) { &[8] } else { sizes };
            let ([f], p) = placement_figures(&[runs], s, pl, split);
            probes.extend(p);
            f
        })
        .collect();
    (figs, median_probe(&probes))
}

/// One row of the one-sided figures' JSON.
#[derive(Debug, PartialEq, Serialize)]
struct RmaRow<'a> {
    size: usize,
    system: &'a str,
    placement: &'a str,
    /// shmfab: the path the operations took (heap, cma, mailbox); Open
    /// MPI: the osc component (osc rdma, osc sm).
    path: String,
    latency_us: Option<f64>,
    bw_gbs: Option<f64>,
    mops: Option<f64>,
}

/// The rows of the one-sided systems (name, path, figures), in order.
fn rma_rows<'a>(systems: &[(&'a str, String, Vec<Figure>)], pl: Placement) -> Vec<RmaRow<'a>> {
    let r6 = |v: Option<f64>| v.map(|x| round_to(x, 6));
    systems
        .iter()
        .flat_map(|(system, path, figs)| {
            figs.iter().map(move |f| RmaRow {
                size: f.size,
                system,
                placement: pl.name(),
                path: path.clone(),
                latency_us: r6(f.half_rtt_us),
                bw_gbs: r6(f.bw_gbs),
                mops: r6(f.mmsgs),
            })
        })
        .collect()
}

/// shmfab's systems of [`RMA_SYSTEMS`] with their paths and figures.
fn ours_rma_named(o: &OursRma) -> Vec<(&'static str, String, Vec<Figure>)> {
    let mut v: Vec<_> =
        (0..4).map(|k| (RMA_SYSTEMS[k].0, o.paths[k].to_string(), o.figs[k].iter().map(as_figure).collect())).collect();
    v.push((RMA_SYSTEMS[4].0, o.fadd_path.to_string(), vec![as_figure(&o.fadd)]));
    v.extend(forms_figures(o).into_iter().map(|(k, f)| (RMA_SYSTEMS[k].0, "heap".to_string(), vec![f])));
    if let Some(f) = &o.fadd_handle {
        v.push((RMA_SYSTEMS[17].0, "heap".to_string(), vec![as_figure(f)]));
    }
    v
}

/// shmfab's 8 B forms of [`bench::FlushForms`] as figures, by index in
/// [`RMA_SYSTEMS`] (a latency each, its rate for one rank beside it).
fn forms_figures(o: &OursRma) -> Vec<(usize, Figure)> {
    let Some(f) = o.forms else { return Vec::new() };
    let fig = |us: f64| Figure { size: 8, half_rtt_us: Some(us), bw_gbs: None, mmsgs: Some(1.0 / us) };
    vec![
        (12, fig(f.put_inject_us)),
        (13, fig(f.put_cntr_us)),
        (14, fig(f.get_cntr_us)),
        (15, fig(f.fadd_cntr_us)),
        (16, fig(f.put_handle_us)),
    ]
}

/// The path or component each one-sided system took over the rounds
/// (the last one seen; `-` when none ran).
fn rma_paths(rounds: &[RmaRound]) -> Vec<String> {
    (0..RMA_SYSTEMS.len())
        .map(|k| rounds.iter().rev().map(|r| r.paths[k].clone()).find(|p| !p.is_empty()).unwrap_or_else(|| "-".into()))
        .collect()
}

/// `compare`'s one-sided tables: latency and bandwidth of put and get by
/// size (shmfab's shared heap and single copy; Open MPI with its default
/// osc component and with osc sm; shmfab's heap ratio to each), then
/// fetch-add, then the ratios the target of issue 16 names.
fn rma_tables(figs: &[Vec<Figure>], paths: &[String]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let ompi = paths[5].clone();
    let _ = writeln!(
        o,
        "one-sided. latency: one operation, then its completion (shmfab: the call, then its CQ entry; Open MPI: \
         MPI_Put/MPI_Get, then MPI_Win_flush): a put's data is in the target's memory, a get's here"
    );
    let _ = writeln!(
        o,
        "Open MPI: {ompi} (its default here), and osc sm; shmfab: heap = alloc_shared, cma = mr_reg'd memory ({})",
        paths[2]
    );
    for (title, get, prec) in [
        ("latency (us)", (|f: &Figure| f.half_rtt_us) as fn(&Figure) -> Option<f64>, 3),
        ("bandwidth (GB/s)", |f: &Figure| f.bw_gbs, 2),
    ] {
        let _ = writeln!(
            o,
            "{:>8} | {:>8} {:>8} {:>8} {:>6} {:>8} {:>6} | {:>8} {:>8} {:>8} {:>6} {:>8} {:>6}",
            "size",
            "put heap",
            "put cma",
            "ompi",
            "/ompi",
            "ompi-sm",
            "/sm",
            "get heap",
            "get cma",
            "ompi",
            "/ompi",
            "ompi-sm",
            "/sm"
        );
        let _ = writeln!(
            o,
            "{}",
            format!("{:>8} | {:^56} | {:^56}", "(bytes)", format!("put {title}"), format!("get {title}")).trim_end()
        );
        for i in 0..figs[0].len() {
            let _ = write!(o, "{:>8}", figs[0][i].size);
            for (heap, cma, om, sm) in [(0, 2, 5, 8), (1, 3, 6, 9)] {
                let v = |k: usize| figs[k].get(i).and_then(get);
                let _ = write!(
                    o,
                    " | {:>8} {:>8} {:>8} {:>6} {:>8} {:>6}",
                    fmt(v(heap), prec),
                    fmt(v(cma), prec),
                    fmt(v(om), prec),
                    ratio(v(heap), v(om)),
                    fmt(v(sm), prec),
                    ratio(v(heap), v(sm))
                );
            }
            let _ = writeln!(o);
        }
        let _ = writeln!(o);
    }
    let fadd = |k: usize| figs[k].first().copied().unwrap_or_default();
    let (us, om, sm, raw) = (fadd(4), fadd(7), fadd(10), fadd(11));
    let _ = writeln!(
        o,
        "fetch-add, 8 B (u64 SUM), on one word of the target: latency of one rank alone; rate of both ranks at once"
    );
    let _ = writeln!(o, "{:>24} | {:>8} {:>6} | {:>8} {:>6}", "", "us", "ratio", "Mops/s", "ratio");
    for (name, f) in [
        (format!("shmfab ({})", paths[4]), us),
        ("shmfab HeapTarget".to_string(), fadd(17)),
        (format!("Open MPI ({})", paths[7]), om),
        (format!("Open MPI ({})", paths[10]), sm),
        ("raw floor (lock xadd)".to_string(), raw),
    ] {
        let _ = writeln!(
            o,
            "{:>24} | {:>8} {:>6} | {:>8} {:>6}",
            name,
            fmt(f.half_rtt_us, 3),
            ratio(us.half_rtt_us, f.half_rtt_us),
            fmt(f.mmsgs, 2),
            ratio(us.mmsgs, f.mmsgs)
        );
    }
    let put8 = |k: usize| figs[k].iter().find(|f| f.size == 8).and_then(|f| f.half_rtt_us);
    let one8 = |k: usize| figs.get(k).and_then(|v| v.first()).and_then(|f| f.half_rtt_us);
    let _ = writeln!(
        o,
        "8 B in the form an MPI one-sided layer over libfabric would complete with (every shmfab RMA is done when \
         its call returns), latency (us) and ratio to Open MPI's put+flush / fetch-and-op+flush:"
    );
    for (name, k, om, sm) in [
        ("put by inject_write", 12, put8(5), put8(8)),
        ("put + counter read", 13, put8(5), put8(8)),
        ("get + counter read", 14, put8(6), put8(9)),
        ("fetch-add + counter read", 15, om.half_rtt_us, sm.half_rtt_us),
        ("put by HeapTarget::write", 16, put8(5), put8(8)),
        ("fetch-add by HeapTarget", 17, om.half_rtt_us, sm.half_rtt_us),
    ] {
        let _ = writeln!(
            o,
            "{:>26} | {:>8} | {:>6} {} | {:>6} (osc sm)",
            name,
            fmt(one8(k), 3),
            ratio(one8(k), om),
            paths[5],
            ratio(one8(k), sm)
        );
    }
    let _ = writeln!(
        o,
        "target (issue 16, 2x better): 8 B put latency shmfab / Open MPI {} ({}), {} (osc sm); fetch-add rate shmfab / Open MPI {} ({}), {} (osc sm)",
        ratio(put8(0), put8(5)),
        paths[5],
        ratio(put8(0), put8(8)),
        ratio(us.mmsgs, om.mmsgs),
        paths[7],
        ratio(us.mmsgs, sm.mmsgs),
    );
    let h = fadd(17);
    let _ = writeln!(
        o,
        "the same through a HeapTarget (the registration resolved once, as an MPI window; done when the call \
         returns): 8 B put latency {} ({}), {} (osc sm); fetch-add rate {} ({}), {} (osc sm)",
        ratio(one8(16), put8(5)),
        paths[5],
        ratio(one8(16), put8(8)),
        ratio(h.mmsgs, om.mmsgs),
        paths[7],
        ratio(h.mmsgs, sm.mmsgs),
    );
    o
}

/// One row of the figures JSON: a system's figures for one size (absent
/// figures are null).
#[derive(Debug, PartialEq, Serialize)]
struct Row<'a> {
    size: usize,
    system: &'a str,
    /// `all`, or `near` / `far` when the run saw two placements.
    placement: &'a str,
    half_rtt_us: Option<f64>,
    bw_gbs: Option<f64>,
    mmsgs: Option<f64>,
}

/// `x` with `places` decimals (what the figures are good for).
fn round_to(x: f64, places: i32) -> f64 {
    let k = 10f64.powi(places);
    (x * k).round() / k
}

/// The JSON rows of each system's figures, in order.
fn rows<'a>(systems: &[(&'a str, &[Figure])]) -> Vec<Row<'a>> {
    let r6 = |v: Option<f64>| v.map(|x| round_to(x, 6));
    systems
        .iter()
        .flat_map(|&(system, figs)| {
            figs.iter().map(move |f| Row {
                size: f.size,
                system,
                placement: Placement::All.name(),
                half_rtt_us: r6(f.half_rtt_us),
                bw_gbs: r6(f.bw_gbs),
                mmsgs: r6(f.mmsgs),
            })
        })
        .collect()
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let mut body = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    body.push('\n');
    std::fs::write(path, body).map_err(|e| format!("{}: {e}", path.display()))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

fn none_for(sizes: &[usize]) -> Vec<Figure> {
    sizes.iter().map(|&size| Figure { size, ..Default::default() }).collect()
}

/// Progress steps of one round of `compare`, with Open MPI (`osu`) and UCX
/// (`ucx`) measured or not.
fn round_steps(sizes: &[usize], osu: bool, ucx: bool, fi_shmfab: bool) -> usize {
    (3 + usize::from(fi_shmfab) + usize::from(osu) + usize::from(ucx)) * sizes.len()
}

/// The systems of `compare`, in the order of its rounds, JSON and legend.
const SYSTEMS: usize = 6;

/// One round of `compare`: shmfab, the raw floor, Open MPI, UCX, libfabric
/// shm, and fi_pingpong over shmfab's provider when there is one. UCX is
/// measured while `ucx_off` is None; a failed UCX run sets it to the
/// reason, and later rounds leave UCX out.
///
/// Every system measures one size at a time with a placement probe on
/// either side ([`bracketed`]): the CPUs change places within a system's
/// turn often enough here (a turn of all sizes takes 10-30 s) that one
/// probe before the turn misfiled whole turns (session 14: a UCX far
/// figure of 1.56 us at 16 KiB that later runs put at 3.7).
fn compare_round(
    o: &CompareArgs,
    sizes: &[usize],
    exe: &Path,
    ucx_off: &mut Option<String>,
    st: &mut Status,
) -> Result<[Run; SYSTEMS], String> {
    let probe = || placement_probe_pair(exe);
    st.say("measuring shmfab ...");
    let ours = bracketed(sizes, probe, |size| {
        measure(&[size], Measures { lat: true, bw: true, rate: true }, st).map(|mut f| f.pop())
    })?;
    st.say("measuring the raw shared-memory floor ...");
    let raw = bracketed(sizes, probe, |size| {
        Ok(Some(latency(st, "raw floor", size, || bench::raw_pingpong(exe, &[], size, bench::iters_for(size)))))
    })?;
    let ompi = match &o.osu {
        Some(p) => {
            st.say("measuring Open MPI (vader BTL) ...");
            bracketed(sizes, probe, |size| {
                st.step(&format!("Open MPI, {}", bytes(size)));
                Ok(bench::openmpi(p, &[size])
                    .map_err(|e| st.warn(&format!("Open MPI, {}: {e}", bytes(size))))
                    .ok()
                    .and_then(|mut f| f.pop()))
            })?
        }
        None => Run::unmeasured(sizes),
    };
    let ucx = match (&o.osu, ucx_off.is_none()) {
        (Some(p), true) => {
            st.say("measuring UCX (Open MPI pml ucx, UCX_TLS=sm,self) ...");
            bracketed(sizes, probe, |size| {
                if ucx_off.is_some() {
                    return Ok(None);
                }
                st.step(&format!("UCX, {}", bytes(size)));
                Ok(bench::ucx(p, &[size])
                    .map_err(|e| {
                        let why = e.detail().map_or_else(|| e.to_string(), str::to_string);
                        st.warn(&format!("UCX: {why} (left out from here on)"));
                        *ucx_off = Some(why);
                    })
                    .ok()
                    .and_then(|mut f| f.pop()))
            })?
        }
        _ => Run::unmeasured(sizes),
    };
    st.say("measuring libfabric shm (fi_pingpong) ...");
    let fi = bracketed(sizes, probe, |size| {
        Ok(Some(latency(st, "fi_pingpong", size, || bench::fi_pingpong(size, fi_iters(size), None))))
    })?;
    let fi_ours = match &o.fi_provider {
        Some(dir) => {
            st.say("measuring fi_pingpong over shmfab's provider ...");
            bracketed(sizes, probe, |size| {
                let run = || bench::fi_pingpong(size, fi_iters(size), Some(dir));
                Ok(Some(latency(st, "fi_pingpong -p shmfab", size, run)))
            })?
        }
        None => Run::unmeasured(sizes),
    };
    Ok([ours, raw, ompi, ucx, fi, fi_ours])
}

/// One latency figure of `what` at `size` by `run` (a progress step; a
/// failure is warned of and leaves the figure empty).
fn latency<E: std::fmt::Display>(
    st: &mut Status,
    what: &str,
    size: usize,
    run: impl FnOnce() -> std::result::Result<f64, E>,
) -> Figure {
    st.step(&format!("{what}, {}", bytes(size)));
    let half_rtt_us = run().map_err(|e| st.warn(&format!("{what}, {size} B: {e}"))).ok();
    Figure { size, half_rtt_us, ..Default::default() }
}

/// Round trips of one fi_pingpong run at `size`.
fn fi_iters(size: usize) -> usize {
    bench::iters_for(size).min(20000)
}

/// Measures `sizes` one at a time with `one` (None: that size is not
/// measured, and no probe is taken for it), with a placement probe before
/// the first and after each, the probe after one size being the probe
/// before the next: each figure gets the probes on either side of it.
fn bracketed(
    sizes: &[usize],
    mut probe: impl FnMut() -> Option<Probe>,
    mut one: impl FnMut(usize) -> Result<Option<Figure>, String>,
) -> Result<Run, String> {
    let mut run = Run::default();
    let mut before = None;
    for &size in sizes {
        if before.is_none() {
            before = probe();
        }
        match one(size)? {
            Some(f) => {
                let after = probe();
                run.probes.push(before);
                run.after.push(after);
                run.figs.push(Figure { size, ..f });
                before = after;
            }
            None => {
                run.probes.push(None);
                run.after.push(None);
                run.figs.push(Figure { size, ..Default::default() });
            }
        }
    }
    Ok(run)
}

/// One system's figures of one round of `compare`, each with the
/// placement probes taken around it.
#[derive(Clone, Debug, Default)]
struct Run {
    /// Per figure: the placement probe measured before it, where the two
    /// CPUs sat then.
    probes: Vec<Option<Probe>>,
    /// Per figure, where taken (empty when the run probed only before):
    /// the probe after it. A figure whose probes on either side fall in
    /// different placements belongs to neither (the CPUs moved during it).
    after: Vec<Option<Probe>>,
    figs: Vec<Figure>,
}

impl Run {
    /// A system not measured: its sizes without figures or probes.
    fn unmeasured(sizes: &[usize]) -> Run {
        Run { probes: vec![None; sizes.len()], after: Vec::new(), figs: none_for(sizes) }
    }

    /// Whether figure `i` was taken in placement `pl`: its probe before
    /// says so, and so does its probe after, where there is one.
    fn holds(&self, i: usize, pl: Placement, s: &Splits) -> bool {
        self.probes.get(i).is_some_and(|&p| pl.holds(p, s))
            && self.after.get(i).copied().flatten().is_none_or(|a| pl.holds(Some(a), s))
    }

    /// Whether any figure of the run belongs to `pl`.
    fn touches(&self, pl: Placement, s: &Splits) -> bool {
        (0..self.probes.len()).any(|i| self.holds(i, pl, s))
    }

    /// Every probe taken for the run, before and after its figures.
    fn all_probes(&self) -> impl Iterator<Item = Probe> + '_ {
        self.probes.iter().chain(&self.after).flatten().copied()
    }
}

/// Rounds of the raw floor's 8 B ping-pong in a placement probe (a few
/// milliseconds).
const PROBE_ITERS: usize = 20_000;

/// Rounds of the raw floor's 16 KiB ping-pong in a placement probe of
/// `compare` (1.5-18 ms).
const PROBE16_ITERS: usize = 1000;

/// The raw floor at 8 B, quickly: the placement of the two CPUs (on these
/// VMs the raw half round trip is about 0.04 us when they share a cache
/// and 0.15-0.25 us when they do not, and it changes over minutes).
fn placement_probe(exe: &Path) -> Option<f64> {
    bench::raw_pingpong(exe, &[], 8, PROBE_ITERS).ok()
}

/// What a placement probe of `compare` found: the raw floor's half round
/// trip at 8 B and at 16 KiB, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Probe {
    us8: f64,
    /// None when the 16 KiB run failed.
    us16: Option<f64>,
}

/// The placement probe of `compare`'s figures: 8 B, then 16 KiB. The 8 B
/// figure parts near from far; among the near ones the 16 KiB figure
/// parts a closer placement, which the 8 B figure does not (session 21,
/// development VM: 8 B 0.030-0.036 us against 0.036-0.054, 16 KiB 0.73-0.80
/// against 2.04-2.70; far 8 B 0.15-0.25, 16 KiB about 8).
fn placement_probe_pair(exe: &Path) -> Option<Probe> {
    let us8 = placement_probe(exe)?;
    Some(Probe { us8, us16: bench::raw_pingpong(exe, &[], 16384, PROBE16_ITERS).ok() })
}

/// Probes this many times apart, with none between them, are two
/// placements.
const PLACEMENT_GAP: f64 = 1.5;

/// Where the probes split in two placements: at the widest gap between
/// two probes next to each other in order (the geometric mean of the
/// two), when it is [`PLACEMENT_GAP`] or more and leaves on either side at
/// least one probe in twenty (one at least): a few probes slowed by the
/// machine's other work do not make a placement of their own. None when
/// the run saw one placement. (Until session 21 the split came from the
/// fastest and slowest probe, 1.8x apart: close and near probes alone,
/// 0.030 and 0.054 us, would have made near "far".)
fn placement_split(probes: impl Iterator<Item = f64>) -> Option<f64> {
    let v = sorted(probes);
    let side = (v.len() / 20).max(1);
    gap_split(v, side, side)
}

/// Where the 16 KiB probes of the placements not far split close from
/// near: as [`placement_split`], but two probes (one figure's) are enough
/// below the gap. Probes slowed by other work fall above it, among the
/// slower, and cannot make the faster side; a close stretch of a minute
/// gives fewer than one probe in twenty of a compare run (session 21: 16
/// KiB probes down to 0.733 us while the split needed 28 of 570, and its
/// figures went into near).
fn close_split(probes: impl Iterator<Item = f64>) -> Option<f64> {
    let v = sorted(probes);
    let high = (v.len() / 20).max(1);
    gap_split(v, 2, high)
}

/// The positive probes, in order.
fn sorted(probes: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = probes.filter(|p| *p > 0.0).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The widest gap of sorted `v` with at least `low` values below it and
/// `high` above, when [`PLACEMENT_GAP`] wide or more: its geometric mean.
fn gap_split(v: Vec<f64>, low: usize, high: usize) -> Option<f64> {
    (low.max(1)..=v.len().saturating_sub(high))
        .map(|i| (v[i] / v[i - 1], i))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|&(gap, _)| gap >= PLACEMENT_GAP)
        .map(|(_, i)| (v[i - 1] * v[i]).sqrt())
}

/// Where a run's probes split: near from far by the 8 B figures
/// ([`placement_split`]), and among those not far, close from near by the
/// 16 KiB ones ([`close_split`]); None where the probes show one placement.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Splits {
    far: Option<f64>,
    close: Option<f64>,
}

impl Splits {
    fn of(probes: impl Iterator<Item = Probe>) -> Splits {
        let probes: Vec<Probe> = probes.collect();
        let far = placement_split(probes.iter().map(|p| p.us8));
        let close = close_split(probes.iter().filter(|p| far.is_none_or(|f| p.us8 < f)).filter_map(|p| p.us16));
        Splits { far, close }
    }

    /// The placements the probes show, near first (its picture is the
    /// main one): just `All` when they show one.
    fn places(&self) -> Vec<Placement> {
        let mut v = Vec::new();
        if self.far.is_some() || self.close.is_some() {
            v.push(Placement::Near);
        }
        if self.far.is_some() {
            v.push(Placement::Far);
        }
        if self.close.is_some() {
            v.push(Placement::Close);
        }
        if v.is_empty() {
            v.push(Placement::All);
        }
        v
    }

    /// How many placements the probes show, in words.
    fn seen(&self) -> &'static str {
        match self.places().len() {
            1 => "one placement",
            2 => "two placements",
            _ => "three placements",
        }
    }
}

/// A placement of the CPUs, as the probes grouped them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// One placement only (or no probe).
    All,
    /// 8 B probes below the far split, 16 KiB probes at or above the
    /// close split (where there is one).
    Near,
    /// 8 B probes at or above the far split.
    Far,
    /// 8 B probes below the far split, 16 KiB probes below the close one.
    Close,
}

impl Placement {
    fn name(self) -> &'static str {
        match self {
            Placement::All => "all",
            Placement::Near => "near",
            Placement::Far => "far",
            Placement::Close => "close",
        }
    }

    /// Whether a run whose probe is `probe` belongs here, with the run's
    /// splits (runs without a probe belong only to `All`; without a 16
    /// KiB figure, neither to near nor to close when the run has a close
    /// split).
    fn holds(self, probe: Option<Probe>, s: &Splits) -> bool {
        let Some(p) = probe else {
            return self == Placement::All;
        };
        let not_far = s.far.is_none_or(|f| p.us8 < f);
        match self {
            Placement::All => true,
            Placement::Far => s.far.is_some_and(|f| p.us8 >= f),
            Placement::Near => not_far && s.close.is_none_or(|c| p.us16.is_some_and(|v| v >= c)),
            Placement::Close => not_far && s.close.is_some_and(|c| p.us16.is_some_and(|v| v < c)),
        }
    }
}

/// The medians of each system's figures taken in one placement (a size
/// with none there has no figure), and the median probe of those figures.
fn placement_figures<const N: usize>(
    per_sys: &[Vec<Run>; N],
    sizes: &[usize],
    pl: Placement,
    split: &Splits,
) -> ([Vec<Figure>; N], Option<Probe>) {
    let mut probes = Vec::new();
    let figs = per_sys.each_ref().map(|runs| {
        let mut out = none_for(sizes);
        for (i, f) in out.iter_mut().enumerate() {
            let here: Vec<&Figure> =
                runs.iter().filter(|r| r.holds(i, pl, split)).filter_map(|r| r.figs.get(i)).collect();
            let pick = |get: fn(&Figure) -> Option<f64>| median(here.iter().filter_map(|f| get(f)).collect());
            f.half_rtt_us = pick(|f| f.half_rtt_us);
            f.bw_gbs = pick(|f| f.bw_gbs);
            f.mmsgs = pick(|f| f.mmsgs);
        }
        for r in runs {
            probes.extend((0..r.probes.len()).filter(|&i| r.holds(i, pl, split)).filter_map(|i| r.probes[i]));
        }
        out
    });
    (figs, median_probe(&probes))
}

/// The median of each figure of the probes (None when there is none).
fn median_probe(probes: &[Probe]) -> Option<Probe> {
    let us8 = median(probes.iter().map(|p| p.us8).collect())?;
    Some(Probe { us8, us16: median(probes.iter().filter_map(|p| p.us16).collect()) })
}

/// Median of the values present (None when no round had one).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

fn cmd_compare(o: &CompareArgs) -> Result<(), String> {
    if let Some(p) = &o.json {
        check_json_path(p)?;
    }
    if let Some(p) = &o.plot {
        check_out_path("--plot", p)?;
    }
    let exe = exe()?;
    let sizes = o.sizes.get();
    // UCX runs under Open MPI (the same osu-style program): without it, or
    // without Open MPI's pml ucx, it is left out with the reason.
    let mut ucx_off = match &o.osu {
        None => Some("no osu-style MPI program (--osu)".to_string()),
        Some(_) => bench::ucx_present().err(),
    };
    let ucx_first = ucx_off.is_none();
    // The systems take turns, round after round, so that a slow spell of
    // the machine touches each of them; each figure is the median.
    let p2p = matches!(o.only, None | Some(Part::P2p));
    let rma = matches!(o.only, None | Some(Part::Rma));
    let coll_bin = match &o.coll_bench {
        Some(p) => Some(p.clone()),
        None => exe.parent().map(|d| d.join("examples").join("coll_bench")).filter(|p| p.is_file()),
    };
    const NO_COLL: &str =
        "no collective benchmark: build it (cargo build --release --example coll_bench) or give --coll-bench";
    if o.only == Some(Part::Coll) && coll_bin.is_none() {
        return Err(NO_COLL.into());
    }
    // In the default set too (about 5 s a round), when it can run.
    let coll = matches!(o.only, None | Some(Part::Coll)) && coll_bin.is_some();
    let mut coll_runs: Vec<CollRun> = Vec::new();
    let mut per_sys: [Vec<Run>; SYSTEMS] = Default::default();
    let mut rma_runs: Vec<RmaRound> = Vec::new();
    let steps = usize::from(p2p) * round_steps(&sizes, o.osu.is_some(), ucx_first, o.fi_provider.is_some())
        + usize::from(rma) * rma_steps(&sizes, o.osu_rma.is_some())
        + usize::from(coll) * COLL_RANKS.len() * (1 + usize::from(o.osu_coll.is_some()));
    let mut st = Status::new(o.rounds * steps);
    for r in 0..o.rounds {
        st.say(&format!("round {} of {}", r + 1, o.rounds));
        if p2p {
            for (all, one) in per_sys.iter_mut().zip(compare_round(o, &sizes, &exe, &mut ucx_off, &mut st)?) {
                all.push(one);
            }
        }
        if rma {
            rma_runs.push(rma_round(o, &sizes, &exe, &mut st)?);
        }
        if let Some(bin) = coll_bin.as_deref().filter(|_| coll) {
            coll_runs.extend(coll_round(bin, o.osu_coll.as_deref(), &exe, &mut st));
        }
    }
    st.finish();
    let ucx_rounds = per_sys[3].iter().filter(|r| r.figs.iter().any(|f| f.half_rtt_us.is_some())).count();
    // The CPUs may change places during the run: each figure carries the
    // raw probes taken just before and after it, and when the probes fall
    // in two or three groups each gets its own tables (a figure whose two
    // probes disagree goes in none).
    let all_probes =
        || per_sys.iter().flatten().chain(rma_runs.iter().flat_map(|r| r.runs.iter())).flat_map(Run::all_probes);
    let split = Splits::of(all_probes());
    let places = split.places();
    let mut rows_out: Vec<serde_json::Value> = Vec::new();
    let mut first_plot = true;
    for &pl in places.iter().filter(|_| p2p) {
        let (figs, probe) = placement_figures(&per_sys, &sizes, pl, &split);
        let runs = per_sys.iter().map(|r| r.iter().filter(|r| r.touches(pl, &split)).count());
        let runs: Vec<String> = SYSTEM_NAMES.iter().zip(runs).map(|(n, k)| format!("{n} {k}")).collect();
        if figs[0].iter().all(|f| f.half_rtt_us.is_none()) {
            println!("\n{} placement: no run of shmfab there (runs: {})", pl.name(), runs.join(", "));
            continue;
        }
        println!();
        if pl != Placement::All {
            println!("{} placement ({}; runs: {}):", pl.name(), probe_words(probe), runs.join(", "));
        }
        print!("{}", compare_tables(&figs));
        if let Some(line) = raw_floor_line(&figs[1]) {
            println!("{line}");
        }
        rows_out.extend(rows(&named(&figs)).into_iter().map(|mut r| {
            r.placement = pl.name();
            serde_json::to_value(r).expect("plain fields")
        }));
        if let Some(p) = &o.plot {
            let date = utc_date(std::time::SystemTime::now());
            let place = if pl == Placement::All { String::new() } else { format!(", {} placement", pl.name()) };
            let sub = format!(
                "{date}, medians of {} round(s){place}{}",
                o.rounds,
                raw_floor_line(&figs[1]).map_or(String::new(), |l| format!("; {l}"))
            );
            let path = if first_plot { p.clone() } else { sibling_path(p, pl.name()) };
            first_plot = false;
            std::fs::write(&path, compare_svg(&figs, &sub)).map_err(|e| format!("{}: {e}", path.display()))?;
            println!("picture: {}", path.display());
        }
    }
    let paths = rma_paths(&rma_runs);
    for &pl in places.iter().filter(|_| rma) {
        let (figs, probe) = rma_placement_figures(&rma_runs, &sizes, pl, &split);
        if figs[0].iter().all(|f| f.half_rtt_us.is_none()) {
            println!("\n{} placement: no one-sided run of shmfab there", pl.name());
            continue;
        }
        println!();
        if pl != Placement::All {
            println!("{} placement, one-sided:", pl.name());
        }
        print!("{}", rma_tables(&figs, &paths));
        if let Some(p) = probe {
            println!("raw floor {:.3} us at 8 B (the median placement probe before these figures)", p.us8);
        }
        let named: Vec<(&str, String, Vec<Figure>)> =
            RMA_SYSTEMS.iter().zip(&paths).zip(figs).map(|((s, p), f)| (s.0, p.clone(), f)).collect();
        rows_out.extend(rma_rows(&named, pl).into_iter().map(|r| serde_json::to_value(r).expect("plain fields")));
    }
    if coll {
        let (table, rows) = coll_report(&coll_runs);
        print!("{table}");
        rows_out.extend(rows);
    } else if o.only.is_none() {
        println!("\ncollectives: left out ({NO_COLL})");
    }
    println!(
        "\nmedians of {} rounds; ratios are shmfab / peer: below 1 is better for latency, above 1 for bandwidth and rate",
        o.rounds
    );
    let probes: Vec<Probe> = all_probes().collect();
    let range = |v: Vec<f64>| v.iter().copied().reduce(f64::min).zip(v.iter().copied().reduce(f64::max));
    if let Some((lo, hi)) = range(probes.iter().map(|p| p.us8).collect()) {
        let k16 = range(probes.iter().filter_map(|p| p.us16).collect())
            .map_or(String::new(), |(lo, hi)| format!(", 16 KiB {lo:.3}-{hi:.3} us"));
        println!(
            "placement probes (raw 8 B and 16 KiB, before and after each size of each system; before each one-sided system): 8 B {lo:.3}-{hi:.3} us{k16}, {} probes: {}",
            probes.len(),
            split.seen()
        );
    }
    if let Some(line) = ucx_note(ucx_off.as_deref(), ucx_rounds).filter(|_| p2p) {
        println!("{line}");
    }
    if let Some(p) = &o.json {
        write_json(p, &rows_out)?;
    }
    Ok(())
}

/// A placement's median probe in words, for its tables' heading.
fn probe_words(p: Option<Probe>) -> String {
    match p {
        None => "no probe".to_string(),
        Some(Probe { us8, us16: None }) => format!("8 B raw probe {us8:.3} us"),
        Some(Probe { us8, us16: Some(k) }) => format!("raw probes 8 B {us8:.3} us, 16 KiB {k:.3} us"),
    }
}

/// `dir/name.ext` becomes `dir/name-tag.ext` (the picture of a second
/// placement).
fn sibling_path(p: &Path, tag: &str) -> std::path::PathBuf {
    let stem = p.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let name = match p.extension() {
        Some(e) => format!("{stem}-{tag}.{}", e.to_string_lossy()),
        None => format!("{stem}-{tag}"),
    };
    p.with_file_name(name)
}

/// Ranks the collectives part runs on.
const COLL_RANKS: [usize; 3] = [2, 4, 8];
/// Calls timed per figure in the collectives part (a fortieth, at least
/// 20, for 1 MiB), in both programs.
const COLL_ITERS: usize = 2000;
/// Allreduce sizes of the collectives part (f64 sum), as both take them.
const COLL_SIZES: &str = "8,1024,1048576";
/// The collective systems, as the JSON names them (`shmfab-barrier`, ...).
const COLL_SYSTEMS: [&str; 2] = ["shmfab", "openmpi"];

/// One run of one collective system on `ranks` ranks.
struct CollRun {
    /// Index in [`COLL_SYSTEMS`].
    system: usize,
    ranks: usize,
    /// The 8 B raw placement probe taken just before.
    probe: Option<f64>,
    figs: Vec<bench::CollFigure>,
}

/// One round of the collectives part: on each of [`COLL_RANKS`], a
/// placement probe, then shmfab (`shmfab run --bind core` of `bin`,
/// examples/coll_bench) and Open MPI (`mpirun` of `osu`, over the vader
/// BTL; bound to cores on 2 ranks, oversubscribed above). A system that
/// fails is left out of the round with a warning.
fn coll_round(bin: &Path, osu: Option<&Path>, exe: &Path, st: &mut Status) -> Vec<CollRun> {
    let mut out = Vec::new();
    for np in COLL_RANKS {
        let n = np.to_string();
        let mut ours = std::process::Command::new(exe);
        ours.args(["run", "-n", &n, "--bind", "core", "--"]).arg(bin);
        ours.args(["--iters", &COLL_ITERS.to_string(), "--sizes", COLL_SIZES, "--no-overlap"]);
        let mut cmds = vec![(0, ours)];
        if let Some(osu) = osu {
            let mut mpi = std::process::Command::new("mpirun");
            mpi.args(["-np", &n, "--allow-run-as-root", "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]);
            if np > 2 {
                mpi.arg("--oversubscribe");
            } else {
                mpi.args(["--bind-to", "core"]);
            }
            mpi.arg(osu).arg(COLL_ITERS.to_string()).arg(COLL_SIZES);
            cmds.push((1, mpi));
        }
        for (system, cmd) in cmds {
            let probe = placement_probe(exe);
            st.say(&format!("measuring {} collectives on {np} ranks ...", COLL_SYSTEMS[system]));
            st.step(&format!("{} collectives, {np} ranks", COLL_SYSTEMS[system]));
            match bench::run_coll(cmd) {
                Ok(figs) => out.push(CollRun { system, ranks: np, probe, figs }),
                Err(e) => st.warn(&format!("{} collectives on {np} ranks: {e}", COLL_SYSTEMS[system])),
            }
        }
    }
    out
}

/// One JSON row of the collectives part.
#[derive(Serialize)]
struct CollRow {
    /// `shmfab-barrier`, `openmpi-allreduce`, ...
    system: String,
    ranks: usize,
    /// Bytes reduced (0 for a barrier).
    size: usize,
    /// Median over rounds of the mean over ranks of each rank's mean.
    latency_us: f64,
    /// Median of the 8 B raw placement probes taken before the runs.
    probe_us: Option<f64>,
    /// More ranks than CPUs: the ranks share them.
    oversubscribed: bool,
}

/// The collectives part's table and JSON rows: medians over rounds by
/// (system, op, ranks, size).
fn coll_report(runs: &[CollRun]) -> (String, Vec<serde_json::Value>) {
    use std::fmt::Write;
    // The CPUs online (not this process's affinity: the probes pin it).
    // SAFETY: sysconf reads a system setting; no memory is passed.
    let cpus = usize::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).unwrap_or(1).max(1);
    let med = |mut v: Vec<f64>| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        (!v.is_empty()).then(|| v[v.len() / 2])
    };
    let mut keys: Vec<(String, usize, usize)> =
        runs.iter().flat_map(|r| r.figs.iter().map(|f| (f.op.clone(), f.ranks, f.size))).collect();
    keys.sort_by_key(|a| (a.0 != "barrier", a.1, a.2));
    keys.dedup();
    let fig = |system: usize, k: &(String, usize, usize)| {
        med(runs
            .iter()
            .filter(|r| r.system == system)
            .flat_map(|r| r.figs.iter())
            .filter(|f| (&f.op, f.ranks, f.size) == (&k.0, k.1, k.2))
            .map(|f| f.latency_us)
            .collect())
    };
    let probe = |system: usize, ranks: usize| {
        med(runs.iter().filter(|r| r.system == system && r.ranks == ranks).filter_map(|r| r.probe).collect())
    };
    let mut t = String::new();
    let _ = writeln!(t, "\ncollectives (mean over ranks of each rank's mean per call, us; allreduce: f64 sum):");
    let _ = writeln!(
        t,
        "{:<10} {:>5} {:>9} {:>12} {:>12} {:>8}  8 B raw probe before shmfab",
        "op", "ranks", "size", "shmfab", "Open MPI", "ratio"
    );
    let mut rows = Vec::new();
    for k in &keys {
        let (a, b) = (fig(0, k), fig(1, k));
        let size = if k.0 == "barrier" { "-".to_string() } else { bytes(k.2) };
        let over = k.1 > cpus;
        let _ = writeln!(
            t,
            "{:<10} {:>5} {:>9} {:>12} {:>12} {:>8}  {}{}",
            k.0,
            k.1,
            size,
            fmt(a, 3),
            fmt(b, 3),
            ratio(a, b),
            probe(0, k.1).map_or("-".to_string(), |p| format!("{p:.3} us")),
            if over { format!(" (oversubscribed: {} ranks on {cpus} CPUs)", k.1) } else { String::new() }
        );
        for (sys, v) in [(0, a), (1, b)] {
            if let Some(v) = v {
                let row = CollRow {
                    system: format!("{}-{}", COLL_SYSTEMS[sys], k.0),
                    ranks: k.1,
                    size: k.2,
                    latency_us: round_to(v, 6),
                    probe_us: probe(sys, k.1).map(|p| round_to(p, 6)),
                    oversubscribed: over,
                };
                rows.push(serde_json::to_value(row).expect("plain fields"));
            }
        }
    }
    (t, rows)
}

/// What the comparison says of UCX under its tables: nothing when every
/// round measured it; "unavailable" with the reason when none did (not
/// installed, no pml ucx, or its first run failed); else how many rounds
/// its medians come from.
fn ucx_note(off: Option<&str>, rounds_measured: usize) -> Option<String> {
    match (off, rounds_measured) {
        (None, _) => None,
        (Some(why), 0) => Some(format!("ucx: unavailable ({why})")),
        (Some(why), n) => Some(format!("ucx: medians of the {n} round(s) before it failed ({why})")),
    }
}

/// The systems' names in the JSON, in the order of [`compare_round`].
const SYSTEM_NAMES: [&str; SYSTEMS] = ["shmfab", "raw", "openmpi", "ucx", "libfabric-shm", "shmfab-fi"];

fn named(figs: &[Vec<Figure>; SYSTEMS]) -> Vec<(&'static str, &[Figure])> {
    SYSTEM_NAMES.iter().zip(figs).map(|(n, f)| (*n, &f[..])).collect()
}

/// The raw floor at the smallest size it was measured at, in words.
fn raw_floor_line(raw: &[Figure]) -> Option<String> {
    raw.iter().find_map(|f| f.half_rtt_us.map(|v| format!("raw floor {v:.3} us at {}", bytes(f.size))))
}

/// `compare`'s two tables: half round trip of every system with shmfab's
/// ratio to each; then bandwidth and message rate of the systems that
/// stream (shmfab, Open MPI, UCX).
fn compare_tables(figs: &[Vec<Figure>; SYSTEMS]) -> String {
    use std::fmt::Write;
    let [ours, raw, ompi, ucx, fi, fi_ours] = figs;
    // fi_pingpong over shmfab's provider: its own columns, with its ratio
    // to fi_pingpong over shm (the same program) and to shmfab's own
    // figure (what the C layer costs), when it was measured.
    let with_fi = fi_ours.iter().any(|f| f.half_rtt_us.is_some());
    let mut o = String::new();
    let _ = write!(
        o,
        "{:>8} | {:>9} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6}",
        "size", "shmfab", "raw", "/raw", "ompi", "/ompi", "ucx", "/ucx", "fi-shm", "/fi"
    );
    if with_fi {
        let _ = write!(o, " | {:>9} {:>6} {:>6}", "fi-shmfab", "/fi", "/own");
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "{}", format!("{:>8} | {:^77}", "(bytes)", "half round-trip (us)").trim_end());
    for i in 0..ours.len() {
        let s = ours[i].half_rtt_us;
        let cell = |f: &Figure| (fmt(f.half_rtt_us, 3), ratio(s, f.half_rtt_us));
        let (r, m, u, f) = (cell(&raw[i]), cell(&ompi[i]), cell(&ucx[i]), cell(&fi[i]));
        let _ = write!(
            o,
            "{:>8} | {:>9} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6}",
            ours[i].size,
            fmt(s, 3),
            r.0,
            r.1,
            m.0,
            m.1,
            u.0,
            u.1,
            f.0,
            f.1
        );
        if with_fi {
            let c = fi_ours[i].half_rtt_us;
            let _ = write!(o, " | {:>9} {:>6} {:>6}", fmt(c, 3), ratio(c, fi[i].half_rtt_us), ratio(c, s));
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "{:>8} | {:>7} {:>7} {:>6} {:>7} {:>6} | {:>7} {:>7} {:>6} {:>7} {:>6}",
        "size", "shmfab", "ompi", "/ompi", "ucx", "/ucx", "shmfab", "ompi", "/ompi", "ucx", "/ucx"
    );
    let _ = writeln!(o, "{}", format!("{:>8} | {:^38} | {:^38}", "(bytes)", "bandwidth (GB/s)", "Mmsg/s").trim_end());
    for i in 0..ours.len() {
        let (s, m, u) = (&ours[i], &ompi[i], &ucx[i]);
        let _ = writeln!(
            o,
            "{:>8} | {:>7} {:>7} {:>6} {:>7} {:>6} | {:>7} {:>7} {:>6} {:>7} {:>6}",
            s.size,
            fmt(s.bw_gbs, 2),
            fmt(m.bw_gbs, 2),
            ratio(s.bw_gbs, m.bw_gbs),
            fmt(u.bw_gbs, 2),
            ratio(s.bw_gbs, u.bw_gbs),
            fmt(s.mmsgs, 2),
            fmt(m.mmsgs, 2),
            ratio(s.mmsgs, m.mmsgs),
            fmt(u.mmsgs, 2),
            ratio(s.mmsgs, u.mmsgs),
        );
    }
    o
}

/// The picture of `compare --plot`: half round trip of every system and
/// streaming bandwidth of those that stream, against size, log-log.
fn compare_svg(figs: &[Vec<Figure>; SYSTEMS], subtitle: &str) -> String {
    use shmfab_tools::plot::{svg, Panel, Series};
    const LOOK: [(&str, &str, bool); SYSTEMS] = [
        ("shmfab", "#d62728", false),
        ("raw shared-memory floor", "#7f7f7f", true),
        ("Open MPI (vader)", "#1f77b4", false),
        ("UCX (sm, under Open MPI)", "#2ca02c", false),
        ("libfabric shm", "#9467bd", false),
        ("fi_pingpong over shmfab's provider", "#ff7f0e", true),
    ];
    let line = |k: usize, get: fn(&Figure) -> Option<f64>| Series {
        name: LOOK[k].0,
        color: LOOK[k].1,
        dashed: LOOK[k].2,
        points: figs[k].iter().map(|f| (f.size as f64, get(f))).collect(),
    };
    let has = |k: usize, get: fn(&Figure) -> Option<f64>| figs[k].iter().any(|f| get(f).is_some());
    let lat = |f: &Figure| f.half_rtt_us;
    let bw = |f: &Figure| f.bw_gbs.map(|g| g * 1000.0);
    let lat_panel = Panel {
        title: "half round trip (lower is better)",
        y_label: "microseconds",
        series: (0..SYSTEMS).filter(|&k| has(k, lat)).map(|k| line(k, lat)).collect(),
    };
    let bw_panel = Panel {
        title: "streaming bandwidth (higher is better)",
        y_label: "MB/s",
        series: (0..SYSTEMS).filter(|&k| has(k, bw)).map(|k| line(k, bw)).collect(),
    };
    svg("shmfab compare: two processes on one node", subtitle, &[lat_panel, bw_panel])
}

/// The UTC date of `t`, `YYYY-MM-DD`.
fn utc_date(t: std::time::SystemTime) -> String {
    let mut days = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()) / 86400;
    let leap = |y: u64| (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    let mut y = 1970;
    while days >= 365 + u64::from(leap(y)) {
        days -= 365 + u64::from(leap(y));
        y += 1;
    }
    let month_days = [31, 28 + u64::from(leap(y)), 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let mut m = 1;
    for len in month_days {
        if days < len {
            break;
        }
        days -= len;
        m += 1;
    }
    let d = days + 1;
    format!("{y:04}-{m:02}-{d:02}")
}

fn cmd_info(o: &InfoArgs, cfg: shmfab::Config) -> Result<(), String> {
    println!("shmfab {}", env!("CARGO_PKG_VERSION"));
    println!("layout version {} (hash {:#018x})", shm_layout::LAYOUT_VERSION, shm_layout::LAYOUT_HASH);
    println!(
        "capabilities: msg, tagged, directed receive, multi-receive, remote CQ data, inject, counters, \
         shared receive queues (up to {} segments per buffer)",
        shmfab::srq::SRQ_MAX_IOV
    );
    println!(
        "limits: inject {} B, max iov {}, max message {} B",
        shmfab::proto::INJECT_SIZE,
        shm_layout::MAX_IOV,
        shmfab::proto::MAX_MSG_SIZE
    );
    let pick_to = (cfg.cma_min.saturating_mul(1 << shmfab::proto::PICK_CLASSES)).min(cfg.split_min);
    if cfg.cma_min > cfg.inline_max + 1 {
        println!(
            "thresholds: with single copy: inline up to {} B, eager through the pool below {} B (fragments of {} B), rendezvous + CMA from {} B (the receiver picks CMA or the pool by measure below {} B; split between both sides from {} B);",
            cfg.inline_max, cfg.cma_min, cfg.frag_size, cfg.cma_min, pick_to, cfg.split_min
        );
    } else {
        println!(
            "thresholds: with single copy: inline up to {} B, rendezvous + CMA from {} B (the receiver picks CMA or the pool by measure below {} B, and after a pick of the pool the next sends of that size go inline or eagerly through the pool; split between both sides from {} B); sends from {} B may need the receiver to complete;",
            cfg.inline_ring_max, cfg.cma_min, pick_to, cfg.split_min, cfg.cma_min
        );
    }
    println!(
        "            without: inline up to {} B, eager through the pool below {} B, rendezvous through the pool from {} B",
        cfg.inline_max, cfg.rndv_min, cfg.rndv_min
    );
    if cfg.pipe_min == 0 {
        println!("            inline messages never piped");
    } else {
        println!(
            "            inline messages from {} B piped (the receiver copies each {} B piece as it lands); \
             an answer to the peer inline up to {} B",
            cfg.pipe_min,
            shmfab::internal::ring::PIPE_PIECE,
            cfg.answer_max
        );
    }
    if cfg.stream_min > cfg.inline_max.max(cfg.answer_max) {
        println!("            streams of inline-sized messages wait for the ring (never through the pool)");
    } else {
        println!(
            "            a stream's inline-sized messages from {} B through the pool (not an answer, the last large \
             one still in the ring, or no room in it)",
            cfg.stream_min.max(shm_layout::CELL_PAYLOAD + 1)
        );
    }
    if cfg.ring_lap == 0 {
        println!("            ring positions move through the whole ring (no lap ends)");
    } else {
        println!(
            "            an answer from ring cell {} on takes the rest of the lap when the ring is empty \
             (a ping-pong reuses the first cells)",
            cfg.ring_lap
        );
    }
    let g = cfg.geometry;
    println!(
        "endpoint section: {} rings x {} cells, overflow queue {} entries, pool {} x {} B: {} KiB per endpoint",
        g.n_slots,
        g.ring_cells,
        g.ovf_cells,
        g.pool_chunks,
        g.chunk_size,
        g.section_size() / 1024
    );
    let cma = if shmfab::internal::cma::available() { "available" } else { "refused" };
    println!("CMA (process_vm_readv): {cma} (policy {:?})", cfg.cma);
    match shmfab::internal::region::shm_dir() {
        Ok(dir) => match rustix::fs::statvfs(&dir) {
            Ok(s) => println!(
                "{}: {} MiB, {} MiB free",
                dir.display(),
                s.f_blocks * s.f_frsize / (1 << 20),
                s.f_bavail * s.f_frsize / (1 << 20)
            ),
            Err(e) => println!("{}: cannot stat: {e}", dir.display()),
        },
        Err(e) => println!("shared memory directory: {e}"),
    }
    match shmfab_tools::topo::discover() {
        Ok(t) => {
            println!(
                "topology (hwloc): {} package(s), {} NUMA node(s), {} core(s), {} hardware thread(s)",
                t.packages,
                t.numa.len(),
                t.cores.len(),
                t.cores.iter().map(|c| c.len()).sum::<usize>()
            );
            for (os, cpus, mem) in &t.numa {
                println!("  NUMA node {os}: CPUs {cpus:?}, {} MiB", mem / (1 << 20));
            }
            let caches: Vec<String> =
                t.caches.iter().map(|(n, count, size)| format!("{count} x {n} {} KiB", size / 1024)).collect();
            println!("  caches: {}", caches.join(", "));
        }
        Err(e) => println!("topology: {e}"),
    }
    let regions = shmfab::internal::region::scan(None);
    let dead = regions.iter().filter(|r| !r.alive).count();
    println!("regions of this user: {} ({dead} with dead owners)", regions.len());
    print_footprint(&cfg, o);
    Ok(())
}

/// Memory per rank for each N, by receive model (see shmfab::internal::footprint).
fn print_footprint(cfg: &shmfab::Config, o: &InfoArgs) {
    use shmfab::internal::footprint::{per_rank, RecvModel};
    let (d, b) = (o.depth, o.buf);
    let per_peer = (d / 2).max(1);
    println!(
        "memory per rank for N ranks (KiB; buffers of {b} B; in-process state {} B per peer):",
        shmfab::internal::footprint::peer_bytes()
    );
    println!("  a: one endpoint, shared receive queue of {d} buffers (shmfab's way: flat in N)");
    println!("  b: one endpoint per peer, each with its own queue of {per_peer} buffers (N squared per node)");
    println!("  c: one endpoint per peer, one SRQ of {d} buffers");
    println!(
        "  {:>6} | {:>10} {:>10} {:>10} | {:>12} {:>12} {:>14}",
        "N", "a shared", "a buffers", "a total", "b total", "c total", "node total a"
    );
    for &n in &o.ranks {
        let a = per_rank(cfg, n, RecvModel::SharedQueue { depth: d }, b);
        let pb = per_rank(cfg, n, RecvModel::PerPeerQueues { depth: per_peer }, b);
        let c = per_rank(cfg, n, RecvModel::PerPeerEndpointsSrq { depth: d }, b);
        println!(
            "  {:>6} | {:>10} {:>10} {:>10} | {:>12} {:>12} {:>10} MiB",
            n,
            a.shared / 1024,
            a.buffers / 1024,
            a.total() / 1024,
            pb.total() / 1024,
            c.total() / 1024,
            n * a.total() / (1 << 20)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_take_suffixes_and_never_wrap() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size(&usize::MAX.to_string()), Ok(usize::MAX));
        for bad in ["", "k", "-1", "+8", "1.5k", "8g", "0x10"] {
            assert!(parse_size(bad).unwrap_err().contains("is not a size"), "{bad:?}");
        }
        // A count that fits but overflows with its unit, and one that does
        // not fit at all: errors, not wrapped values.
        let e = parse_size(&format!("{}k", usize::MAX / 1024 + 1)).unwrap_err();
        assert!(e.contains("too large"), "{e}");
        assert!(parse_size("99999999999999999999999").unwrap_err().contains("too large"));
        assert_eq!(bench_size("8m"), Ok(8 << 20));
        assert!(bench_size("9m").unwrap_err().contains("above the 8388608 limit"));
        assert!(buf_size("0").is_err());
        let r = in_range(1, 50);
        assert_eq!(r("50"), Ok(50));
        assert!(r("0").unwrap_err().contains("1..=50"));
        assert!(r("99999999999999999999999").unwrap_err().contains("too large"));
        assert!(r("x").unwrap_err().contains("not a number"));
    }

    #[test]
    fn commands_parse_with_their_defaults() {
        let parse = |v: &[&str]| Cli::try_parse_from(std::iter::once("shmfab").chain(v.iter().copied()));
        let Cmd::Bench(b) = parse(&["bench"]).unwrap().cmd else { panic!("bench") };
        assert_eq!((b.what, b.sizes.get(), b.compare, b.rounds), (What::All, DEFAULT_SIZES.to_vec(), false, 3));
        let Cmd::Bench(b) = parse(&["bench", "bw", "--sizes", "8,4k,1m", "--json", "f"]).unwrap().cmd else {
            panic!("bench")
        };
        assert_eq!((b.what, b.sizes.get(), b.json), (What::Bw, vec![8, 4096, 1 << 20], Some("f".into())));
        let Cmd::Run(r) = parse(&["run", "-n", "3", "--bind", "core", "--", "sh", "-c", "exit 0"]).unwrap().cmd else {
            panic!("run")
        };
        assert_eq!((r.n, r.bind, r.program.len()), (3, shmfab_tools::run::Bind::Core, 3));
        let Cmd::Info(i) = parse(&["info"]).unwrap().cmd else { panic!("info") };
        assert_eq!((i.ranks, i.depth, i.buf), (vec![2, 8, 64, 256], 128, 4096));
        let Cmd::Compare(c) = parse(&["compare", "--rounds", "5"]).unwrap().cmd else { panic!("compare") };
        assert_eq!((c.rounds, c.osu, c.plot), (5, None, None));
        assert!(c.sizes.get().contains(&(16 << 10)) && c.sizes.get().contains(&(256 << 10)));
        let Cmd::Compare(c) = parse(&["compare", "--plot", "f.svg"]).unwrap().cmd else { panic!("compare") };
        assert_eq!(c.plot, Some("f.svg".into()));
        assert!(matches!(parse(&["clean", "--dry-run"]).unwrap().cmd, Cmd::Clean { dry_run: true }));
        assert!(matches!(parse(&["inspect", "abcd0123"]).unwrap().cmd, Cmd::Inspect { job: Some(_) }));
        // Usage errors: status 2, as clap gives them.
        for bad in [
            &["bench", "nosuch"][..],
            &["bench", "--sizes", "9m"],
            &["bench", "--rounds", "3"],
            &["run", "-n", "2", "true"],
            &["run", "-n", "0", "--", "true"],
            &["info", "--ranks", "0"],
            &["info", "--depth", "1"],
            &["frobnicate"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }

    #[test]
    fn compare_takes_only_one_part() {
        let parse = |v: &[&str]| Cli::try_parse_from(std::iter::once("shmfab").chain(v.iter().copied()));
        let Cmd::Compare(c) = parse(&["compare", "--only", "rma", "--osu-rma", "x"]).unwrap().cmd else { panic!() };
        assert_eq!((c.only, c.osu_rma), (Some(Part::Rma), Some("x".into())));
        let Cmd::Compare(c) = parse(&["compare"]).unwrap().cmd else { panic!() };
        assert_eq!(c.only, None);
        assert!(parse(&["compare", "--only", "both"]).is_err());
        let Cmd::Compare(c) = parse(&["compare", "--only", "coll", "--osu-coll", "y"]).unwrap().cmd else { panic!() };
        assert_eq!((c.only, c.osu_coll, c.coll_bench), (Some(Part::Coll), Some("y".into()), None));
        let Cmd::Bench(b) = parse(&["bench", "rma", "--iters", "50"]).unwrap().cmd else { panic!() };
        assert_eq!((b.what, b.iters), (What::Rma, Some(50)));
        let Cmd::Bench(b) = parse(&["bench", "raw"]).unwrap().cmd else { panic!() };
        assert_eq!(b.what, What::Raw);
    }

    /// One-sided figures of every system at 8 B and 4 KiB (Open MPI's
    /// sm component without any).
    fn rma_figs() -> Vec<Vec<Figure>> {
        let f = |size, l: f64, b: f64| Figure { size, half_rtt_us: Some(l), bw_gbs: Some(b), mmsgs: Some(1.0) };
        let two = |l: f64, b: f64| vec![f(8, l, b), f(4096, l * 4.0, b * 100.0)];
        let fadd = |l: f64, r: f64| vec![Figure { size: 8, half_rtt_us: Some(l), bw_gbs: None, mmsgs: Some(r) }];
        vec![
            two(0.05, 0.2),
            two(0.06, 0.2),
            two(1.0, 0.01),
            two(1.1, 0.01),
            fadd(0.1, 12.0),
            two(0.1, 0.3),
            two(0.2, 0.1),
            fadd(0.3, 5.0),
            none_for(&[8, 4096]),
            none_for(&[8, 4096]),
            none_for(&[8]),
            vec![Figure { size: 8, half_rtt_us: None, bw_gbs: None, mmsgs: Some(150.0) }],
            fadd(0.02, 50.0),
            fadd(0.03, 33.0),
            fadd(0.04, 25.0),
            fadd(0.05, 20.0),
            fadd(0.015, 66.0),
            fadd(0.04, 30.0),
        ]
    }

    #[test]
    fn rma_tables_give_the_targets_ratios() {
        let paths: Vec<String> = ["heap", "heap", "cma", "cma", "heap"]
            .iter()
            .map(|s| s.to_string())
            .chain((0..6).map(|k| if k < 3 { "osc rdma" } else { "osc sm" }.to_string()))
            .chain(["lock xadd".to_string()])
            .chain((0..6).map(|_| "heap".to_string()))
            .collect();
        let t = rma_tables(&rma_figs(), &paths);
        let row = t.lines().find(|l| l.trim_start().starts_with("8 |")).unwrap();
        // put: heap 0.05 against osc rdma's 0.1: 0.50x; osc sm: dashes.
        assert!(row.contains("0.050") && row.contains("0.50x") && row.contains("0.30x"), "{row}");
        assert!(t.contains("8 B put latency shmfab / Open MPI 0.50x (osc rdma), - (osc sm)"), "{t}");
        assert!(t.contains("fetch-add rate shmfab / Open MPI 2.40x (osc rdma)"), "{t}");
        assert!(t.contains("HeapTarget (the registration resolved once"), "{t}");
        assert!(t.contains("8 B put latency 0.15x (osc rdma), - (osc sm); fetch-add rate 6.00x (osc rdma)"), "{t}");
        let f = t.lines().find(|l| l.contains("fetch-add by HeapTarget")).unwrap();
        assert!(f.contains("0.040") && f.contains("0.13x"), "{f}");
        let f = t.lines().find(|l| l.contains("shmfab HeapTarget")).unwrap();
        assert!(f.contains("0.040") && f.contains("30.00"), "{f}");
        // The MPI-layer forms: inject put 0.02 against osc rdma's 0.1.
        let f = t.lines().find(|l| l.contains("put by inject_write")).unwrap();
        assert!(f.contains("0.020") && f.contains("0.20x"), "{f}");
        let f = t.lines().find(|l| l.contains("fetch-add + counter read")).unwrap();
        assert!(f.contains("0.050") && f.contains("0.17x"), "{f}");
        let f = t.lines().find(|l| l.contains("shmfab (heap)")).unwrap();
        assert!(f.contains("0.100") && f.contains("12.00"), "{f}");
        // The raw floor: its rate, and shmfab's 12 against its 150.
        let f = t.lines().find(|l| l.contains("raw floor (lock xadd)")).unwrap();
        assert!(f.contains("150.00") && f.contains("0.08x"), "{f}");
    }

    #[test]
    fn rma_json_rows_name_system_path_and_fields() {
        let paths = [
            "heap",
            "heap",
            "cma",
            "cma",
            "heap",
            "osc rdma",
            "osc rdma",
            "osc rdma",
            "-",
            "-",
            "-",
            "lock xadd",
            "heap",
            "heap",
            "heap",
            "heap",
            "heap",
            "heap",
        ];
        let named: Vec<(&str, String, Vec<Figure>)> =
            RMA_SYSTEMS.iter().zip(paths).zip(rma_figs()).map(|((s, p), f)| (s.0, p.to_string(), f)).collect();
        let v = serde_json::to_value(rma_rows(&named, Placement::Near)).unwrap();
        let rows = v.as_array().unwrap();
        assert_eq!(rows.len(), 8 * 2 + 10);
        let raw = rows.iter().find(|r| r["system"] == "raw-fetch-add").unwrap();
        assert_eq!((raw["system"].as_str(), raw["mops"].as_f64()), (Some("raw-fetch-add"), Some(150.0)));
        assert_eq!(
            rows[0],
            serde_json::json!({"size": 8, "system": "shmfab-put", "placement": "near", "path": "heap",
                "latency_us": 0.05, "bw_gbs": 0.2, "mops": 1.0})
        );
        let fadd = rows.iter().find(|r| r["system"] == "openmpi-fetch-add").unwrap();
        assert_eq!(
            (fadd["size"].as_u64(), fadd["mops"].as_f64(), fadd["path"].as_str()),
            (Some(8), Some(5.0), Some("osc rdma"))
        );
        let names: Vec<&str> = RMA_SYSTEMS.iter().map(|s| s.0).collect();
        for want in ["shmfab-put", "openmpi-put", "shmfab-fetch-add", "openmpi-fetch-add", "shmfab-get-cma"] {
            assert!(names.contains(&want), "{want}");
        }
    }

    #[test]
    fn json_rows_keep_their_field_names_and_six_decimals() {
        let figs = [Figure { size: 8, half_rtt_us: Some(0.123_456_789), bw_gbs: None, mmsgs: Some(6.5) }];
        let raw = [Figure { size: 8, half_rtt_us: Some(0.05), ..Default::default() }];
        let v = serde_json::to_value(rows(&[("shmfab", &figs), ("raw", &raw)])).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"size": 8, "system": "shmfab", "placement": "all", "half_rtt_us": 0.123457, "bw_gbs": null, "mmsgs": 6.5},
                {"size": 8, "system": "raw", "placement": "all", "half_rtt_us": 0.05, "bw_gbs": null, "mmsgs": null},
            ])
        );
        let text = serde_json::to_string(&rows(&[("shmfab", &figs)])).unwrap();
        assert!(text.starts_with(r#"[{"size":8,"system":"shmfab","placement":"all","half_rtt_us":"#), "{text}");
    }

    /// Figures of the six systems for sizes 8 and 16 KiB: UCX and
    /// fi_pingpong over shmfab without any (unavailable), the raw floor at
    /// 8 B only.
    fn six_systems() -> [Vec<Figure>; SYSTEMS] {
        let f =
            |size, h: Option<f64>, b: Option<f64>, r: Option<f64>| Figure { size, half_rtt_us: h, bw_gbs: b, mmsgs: r };
        [
            vec![f(8, Some(0.1), Some(0.2), Some(20.0)), f(16384, Some(3.0), Some(9.0), None)],
            vec![f(8, Some(0.04), None, None), f(16384, None, None, None)],
            vec![f(8, Some(0.2), Some(0.1), Some(10.0)), f(16384, Some(2.7), Some(6.0), None)],
            none_for(&[8, 16384]),
            vec![f(8, Some(0.4), None, None), f(16384, Some(4.0), None, None)],
            none_for(&[8, 16384]),
        ]
    }

    #[test]
    fn compare_tables_show_ucx_beside_the_others() {
        let mut figs = six_systems();
        figs[3][1].half_rtt_us = Some(0.6);
        figs[3][1].bw_gbs = Some(18.0);
        let t = compare_tables(&figs);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains(" ucx ") && lines[0].contains("/ucx"), "{t}");
        // 16 KiB: shmfab 3.0 against UCX 0.6 is 5.00x; bandwidth 9 / 18.
        let row = lines.iter().find(|l| l.trim_start().starts_with("16384 |") && l.contains("0.600")).unwrap();
        assert!(row.contains("5.00x") && row.contains("1.11x") && row.contains("0.75x"), "{row}");
        let bw = lines.iter().rfind(|l| l.trim_start().starts_with("16384 |")).unwrap();
        assert!(bw.contains("18.00") && bw.contains("0.50x") && bw.contains("1.50x"), "{bw}");
        // Without UCX figures its columns are dashes, not a failure.
        let t = compare_tables(&six_systems());
        let row = t.lines().find(|l| l.trim_start().starts_with("16384 |")).unwrap();
        assert_eq!(row.matches(" -").count(), 4, "raw and ucx, value and ratio: {row}");
    }

    #[test]
    fn fi_pingpong_over_shmfab_gets_its_columns_only_when_measured() {
        let t = compare_tables(&six_systems());
        assert!(!t.contains("fi-shmfab"), "{t}");
        let mut figs = six_systems();
        figs[5][0].half_rtt_us = Some(0.12);
        let t = compare_tables(&figs);
        let head = t.lines().next().unwrap();
        assert!(head.contains("fi-shmfab") && head.contains("/own"), "{head}");
        // 8 B: 0.12 against fi over shm 0.4 (0.30x) and shmfab's 0.1 (1.20x).
        let row = t.lines().find(|l| l.trim_start().starts_with("8 |")).unwrap();
        assert!(row.ends_with("|     0.120  0.30x  1.20x"), "{row}");
        let row = t.lines().find(|l| l.trim_start().starts_with("16384 |")).unwrap();
        assert!(row.ends_with("|         -      -      -"), "{row}");
    }

    #[test]
    fn compare_json_names_ucx_and_the_floor_line_its_size() {
        let figs = six_systems();
        let v = serde_json::to_value(rows(&named(&figs))).unwrap();
        let systems: Vec<&str> = v.as_array().unwrap().iter().map(|r| r["system"].as_str().unwrap()).collect();
        assert_eq!(
            systems,
            [
                "shmfab",
                "shmfab",
                "raw",
                "raw",
                "openmpi",
                "openmpi",
                "ucx",
                "ucx",
                "libfabric-shm",
                "libfabric-shm",
                "shmfab-fi",
                "shmfab-fi"
            ]
        );
        assert_eq!(raw_floor_line(&figs[1]).as_deref(), Some("raw floor 0.040 us at 8 B"));
        assert_eq!(raw_floor_line(&none_for(&[8])), None);
    }

    #[test]
    fn the_compare_picture_has_a_line_per_system_with_figures() {
        let mut figs = six_systems();
        let out = compare_svg(&figs, "2026-11-23");
        let lines = |n: &str| out.matches(&format!(r#"data-series="{n}""#)).count();
        // Half round trip: shmfab, raw, Open MPI, fi; bandwidth: shmfab, Open MPI.
        assert_eq!(
            (lines("shmfab"), lines("raw shared-memory floor"), lines("Open MPI (vader)"), lines("libfabric shm")),
            (2, 1, 2, 1)
        );
        assert_eq!(lines("UCX (sm, under Open MPI)"), 0);
        assert!(!out.contains("UCX"), "no figures, no legend entry");
        figs[3][0].half_rtt_us = Some(0.12);
        figs[3][0].bw_gbs = Some(0.3);
        let out = compare_svg(&figs, "2026-11-23");
        assert_eq!(out.matches(r#"data-series="UCX (sm, under Open MPI)""#).count(), 2);
        // Bandwidth in MB/s: 0.2 GB/s is 200 MB/s, inside the 100-1000 decade... and the axis goes to 10000 for 9 GB/s.
        assert!(out.contains(">10000</text>") && out.contains(">MB/s</text>"), "{out}");
    }

    /// A probe of 8 B alone (its 16 KiB run failed, or the test needs
    /// none).
    fn pr(us8: f64) -> Option<Probe> {
        Some(Probe { us8, us16: None })
    }

    /// A probe of both sizes.
    fn pr2(us8: f64, us16: f64) -> Option<Probe> {
        Some(Probe { us8, us16: Some(us16) })
    }

    #[test]
    fn probes_split_in_two_placements_only_when_far_apart() {
        assert_eq!(placement_split([0.04, 0.05, 0.045].into_iter()), None, "one placement");
        assert_eq!(placement_split(std::iter::empty()), None);
        let t = placement_split([0.04, 0.21, 0.05, 0.25].into_iter()).unwrap();
        assert!((t - (0.05f64 * 0.21).sqrt()).abs() < 1e-9, "geometric mean of 0.05 and 0.21: {t}");
        // The widest gap, not the ends: close and near alone are one
        // placement by 8 B (0.030-0.054), and a few slow probes are none.
        assert_eq!(placement_split([0.030, 0.036, 0.041, 0.044, 0.054].into_iter()), None);
        let mut v = vec![0.044; 40];
        v.extend([0.046, 1.06]);
        assert_eq!(placement_split(v.into_iter()), None, "one probe in 42 slowed: no placement of its own");
        let far = placement_split([0.036, 0.054, 0.12, 0.245, 0.39].into_iter()).unwrap();
        assert!(far > 0.054 && far < 0.12, "{far}");
        let s = Splits { far: Some(t), close: None };
        assert!(Placement::Near.holds(pr(0.05), &s) && !Placement::Near.holds(pr(0.21), &s));
        assert!(Placement::Far.holds(pr(0.11), &s) && !Placement::Far.holds(None, &s));
        assert!(Placement::All.holds(None, &s) && Placement::All.holds(pr(9.0), &s));
        assert!(!Placement::Close.holds(pr(0.03), &s), "no close placement without a close split");
        assert_eq!(s.places(), [Placement::Near, Placement::Far]);
        assert_eq!(Splits::default().places(), [Placement::All]);
        assert_eq!(Splits::default().seen(), "one placement");
    }

    #[test]
    fn the_16_kib_probe_parts_a_closer_placement_from_near() {
        // The probes of session 21: close 8 B 0.030-0.036 with 16 KiB
        // 0.73-0.80, near 0.036-0.054 with 2.04-2.70, far 0.19 with 8.1.
        let probes = [
            pr2(0.030, 0.74),
            pr2(0.036, 0.736),
            pr2(0.036, 2.044),
            pr2(0.044, 2.09),
            pr2(0.054, 2.7),
            pr2(0.19, 8.1),
            pr2(0.21, 8.9),
        ];
        let s = Splits::of(probes.iter().flatten().copied());
        let (far, close) = (s.far.unwrap(), s.close.unwrap());
        assert!(far > 0.054 && far < 0.19, "{far}");
        assert!(close > 0.80 && close < 2.04, "the far probes' 16 KiB figures left out: {close}");
        assert_eq!(s.places(), [Placement::Near, Placement::Far, Placement::Close]);
        assert_eq!(s.seen(), "three placements");
        let is = |p: Option<Probe>| {
            [Placement::Near, Placement::Far, Placement::Close]
                .into_iter()
                .filter(|pl| pl.holds(p, &s))
                .collect::<Vec<_>>()
        };
        assert_eq!(is(pr2(0.036, 0.736)), [Placement::Close], "an 8 B figure near's own: 16 KiB decides");
        assert_eq!(is(pr2(0.036, 2.044)), [Placement::Near]);
        assert_eq!(is(pr2(0.19, 0.5)), [Placement::Far], "far by 8 B whatever its 16 KiB");
        assert_eq!(is(pr(0.04)), Vec::<Placement>::new(), "without its 16 KiB figure: neither close nor near");
        // Without far probes, close and near still part.
        let s = Splits::of(probes[..5].iter().flatten().copied());
        assert_eq!((s.far, s.places()), (None, vec![Placement::Near, Placement::Close]));
        // Two close probes (one figure's) among many near ones part, and
        // a few slowed 16 KiB probes do not.
        let mut many: Vec<Option<Probe>> = (0..60).map(|i| pr2(0.044, 2.0 + i as f64 / 100.0)).collect();
        many.extend([pr2(0.031, 0.74), pr2(0.031, 0.75)]);
        let s = Splits::of(many.iter().flatten().copied());
        assert!(s.close.is_some_and(|c| c > 0.75 && c < 2.0), "{s:?}");
        many.truncate(60);
        many.extend([pr2(0.045, 9.0), pr2(0.045, 12.0)]);
        assert_eq!(Splits::of(many.iter().flatten().copied()).close, None, "slowed probes make no placement");
        // Near alone: one placement, however the 8 B probes spread.
        let s = Splits::of(probes[2..5].iter().flatten().copied());
        assert_eq!(s, Splits::default());
        assert_eq!(probe_words(pr2(0.03, 0.74)), "raw probes 8 B 0.030 us, 16 KiB 0.740 us");
        assert_eq!(probe_words(pr(0.044)), "8 B raw probe 0.044 us");
        assert_eq!(probe_words(None), "no probe");
    }

    #[test]
    fn each_placement_takes_the_medians_of_its_own_runs() {
        let one = |probe: f64, h: f64| Run {
            probes: vec![pr(probe)],
            after: Vec::new(),
            figs: vec![Figure { size: 8, half_rtt_us: Some(h), ..Default::default() }],
        };
        let mut per_sys: [Vec<Run>; SYSTEMS] = Default::default();
        per_sys[0] = vec![one(0.04, 0.12), one(0.22, 0.31), one(0.05, 0.14), one(0.20, 0.33), one(0.045, 0.13)];
        per_sys[2] = vec![one(0.21, 0.2)];
        let t = Splits::of(per_sys.iter().flatten().flat_map(Run::all_probes));
        assert!(t.far.is_some() && t.close.is_none());
        let (near, p) = placement_figures(&per_sys, &[8], Placement::Near, &t);
        assert_eq!((near[0][0].half_rtt_us, p), (Some(0.13), pr(0.045)));
        assert_eq!(near[2][0].half_rtt_us, None, "Open MPI ran only while far");
        let (far, p) = placement_figures(&per_sys, &[8], Placement::Far, &t);
        assert_eq!((far[0][0].half_rtt_us, far[2][0].half_rtt_us), (Some(0.32), Some(0.2)));
        assert_eq!(p, pr(0.21));
        assert_eq!(far[1][0].size, 8, "a system without runs still has its sizes");
        // A run whose sizes were measured apart (fi_pingpong): each size
        // goes where its own probe says.
        let mut per_sys: [Vec<Run>; SYSTEMS] = Default::default();
        let f = |size, h| Figure { size, half_rtt_us: Some(h), ..Default::default() };
        per_sys[4] =
            vec![Run { probes: vec![pr(0.04), pr(0.22)], after: Vec::new(), figs: vec![f(8, 0.3), f(64, 0.9)] }];
        let (near, _) = placement_figures(&per_sys, &[8, 64], Placement::Near, &t);
        let (far, _) = placement_figures(&per_sys, &[8, 64], Placement::Far, &t);
        assert_eq!((near[4][0].half_rtt_us, near[4][1].half_rtt_us), (Some(0.3), None));
        assert_eq!((far[4][0].half_rtt_us, far[4][1].half_rtt_us), (None, Some(0.9)));
        // A close run among near ones: its own table, and the near medians
        // without it.
        let mut per_sys: [Vec<Run>; SYSTEMS] = Default::default();
        let at = |p: Option<Probe>, h: f64| Run { probes: vec![p], after: vec![p], figs: vec![f(16384, h)] };
        per_sys[0] = vec![at(pr2(0.044, 2.1), 2.3), at(pr2(0.031, 0.74), 1.0), at(pr2(0.046, 2.2), 2.4)];
        let t = Splits::of(per_sys.iter().flatten().flat_map(Run::all_probes));
        let (near, p) = placement_figures(&per_sys, &[16384], Placement::Near, &t);
        let (close, q) = placement_figures(&per_sys, &[16384], Placement::Close, &t);
        let near_h = near[0][0].half_rtt_us.unwrap();
        assert!((near_h - 2.35).abs() < 1e-9 && close[0][0].half_rtt_us == Some(1.0), "{near_h}");
        let (p, q) = (p.unwrap(), q.unwrap());
        assert!((p.us8 - 0.045).abs() < 1e-9 && (p.us16.unwrap() - 2.15).abs() < 1e-9, "{p:?}");
        assert_eq!(q, pr2(0.031, 0.74).unwrap(), "medians of each figure of the probes");
    }

    #[test]
    fn a_figure_whose_probes_disagree_goes_in_neither_placement() {
        let f = |size, h| Figure { size, half_rtt_us: Some(h), ..Default::default() };
        // 8 B near on both sides, 64 B near before and far after (the CPUs
        // moved during it), 1 KiB far on both sides.
        let run = Run {
            probes: vec![pr(0.04), pr(0.05), pr(0.21)],
            after: vec![pr(0.05), pr(0.21), pr(0.22)],
            figs: vec![f(8, 0.1), f(64, 0.5), f(1024, 0.9)],
        };
        let t = Splits::of(run.all_probes());
        let mut per_sys: [Vec<Run>; SYSTEMS] = Default::default();
        per_sys[0] = vec![run];
        let (near, p) = placement_figures(&per_sys, &[8, 64, 1024], Placement::Near, &t);
        let (far, q) = placement_figures(&per_sys, &[8, 64, 1024], Placement::Far, &t);
        let h = |v: &[Figure]| v.iter().map(|f| f.half_rtt_us).collect::<Vec<_>>();
        assert_eq!(h(&near[0]), [Some(0.1), None, None]);
        assert_eq!(h(&far[0]), [None, None, Some(0.9)]);
        assert_eq!((p, q), (pr(0.04), pr(0.21)), "the median probe of the figures kept");
        let (all, _) = placement_figures(&per_sys, &[8, 64, 1024], Placement::All, &t);
        assert_eq!(h(&all[0]), [Some(0.1), Some(0.5), Some(0.9)], "one placement keeps every figure");
        assert!(per_sys[0][0].touches(Placement::Near, &t) && per_sys[0][0].touches(Placement::Far, &t));
    }

    #[test]
    fn bracketed_probes_each_size_on_both_sides_and_skips_unmeasured_ones() {
        let mut next = [0.04, 0.05, 0.2, 0.21].into_iter().map(|v| Probe { us8: v, us16: None });
        let mut asked = Vec::new();
        let run = bracketed(
            &[8, 4096, 65536],
            || next.next(),
            |size| {
                asked.push(size);
                Ok((size != 4096).then(|| Figure { half_rtt_us: Some(size as f64), ..Default::default() }))
            },
        )
        .unwrap();
        assert_eq!(asked, [8, 4096, 65536]);
        assert_eq!(run.probes, [pr(0.04), None, pr(0.05)], "the probe after 8 B is the one before 64 KiB");
        assert_eq!(run.after, [pr(0.05), None, pr(0.2)]);
        assert_eq!(run.figs.iter().map(|f| f.size).collect::<Vec<_>>(), [8, 4096, 65536], "each figure has its size");
        assert_eq!(run.figs[1].half_rtt_us, None);
        assert_eq!(next.next(), pr(0.21), "no probe taken for the size left out");
        let err = bracketed(&[8], || pr(0.04), |_| Err("link broke".to_string())).unwrap_err();
        assert_eq!(err, "link broke");
    }

    #[test]
    fn a_second_picture_goes_beside_the_first() {
        assert_eq!(sibling_path(Path::new("docs/compare.svg"), "far"), Path::new("docs/compare-far.svg"));
        assert_eq!(sibling_path(Path::new("plot"), "far"), Path::new("plot-far"));
    }

    #[test]
    fn ucx_is_said_unavailable_with_its_reason() {
        assert_eq!(ucx_note(None, 3), None);
        assert_eq!(
            ucx_note(Some("mpirun: PML ucx cannot be selected"), 0).as_deref(),
            Some("ucx: unavailable (mpirun: PML ucx cannot be selected)")
        );
        assert_eq!(ucx_note(Some("x"), 2).as_deref(), Some("ucx: medians of the 2 round(s) before it failed (x)"));
    }

    #[test]
    fn utc_dates() {
        let at = |s: u64| utc_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01");
        assert_eq!(at(951_782_400), "2000-02-29");
        assert_eq!(at(1_735_603_200 + 86399), "2024-12-31");
        assert_eq!(at(1_795_392_000), "2026-11-23");
    }

    #[test]
    fn median_of_odd_even_and_missing() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn figures_take_each_field_over_the_rounds_that_have_it() {
        let f = |h: Option<f64>, b: Option<f64>| Figure { size: 8, half_rtt_us: h, bw_gbs: b, mmsgs: None };
        let run = |fig| Run { probes: vec![None], after: Vec::new(), figs: vec![fig] };
        let mut per_sys: [Vec<Run>; SYSTEMS] = Default::default();
        per_sys[0] = vec![run(f(Some(0.3), None)), run(f(Some(0.1), Some(2.0))), run(f(Some(0.2), None))];
        let (m, p) = placement_figures(&per_sys, &[8], Placement::All, &Splits::default());
        assert_eq!(m[0].len(), 1);
        assert_eq!((m[0][0].size, m[0][0].half_rtt_us, m[0][0].bw_gbs, m[0][0].mmsgs), (8, Some(0.2), Some(2.0), None));
        assert_eq!(p, None, "no probe taken");
    }
}
