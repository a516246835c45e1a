//! The `shmfab` command: benchmarks between two processes it starts itself,
//! the side-by-side comparison with the installed peers, the embedded
//! launcher, a live job's state, region cleanup and facts about the node.
//! Arguments are parsed by clap (usage errors exit with status 2, other
//! failures with 1); figures are written as JSON by serde.

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use shmfab_tools::bench::{self, Figure, Link};
use shmfab_tools::status::Status;
use std::path::{Path, PathBuf};

/// Window of the message-rate test: osu_mbw_mr's default.
const RATE_WINDOW: usize = 64;

const DEFAULT_SIZES: [usize; 7] = [8, 64, 1024, 4096, 65536, 1 << 20, 4 << 20];

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
    /// shmfab, the raw shared-page floor, Open MPI (osu-style program at
    /// --osu) and libfabric shm (fi_pingpong) side by side, with shmfab's
    /// ratios; the systems take turns for --rounds rounds, each figure the median
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
}

#[derive(Clone, Debug, Args)]
struct CompareArgs {
    #[command(flatten)]
    sizes: SizesArg,
    /// Write the figures of every system to FILE as JSON
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The osu-style MPI program (without it, Open MPI is left out)
    #[arg(long, value_name = "PATH")]
    osu: Option<PathBuf>,
    /// Rounds the systems take turns for (1 to 50)
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = in_range(1, 50))]
    rounds: usize,
}

#[derive(Clone, Debug, Args)]
struct SizesArg {
    /// Message sizes in bytes, with k or m for KiB or MiB [default: 8,64,1k,4k,64k,1m,4m]
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
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("--json {}: cannot write it: {e}", path.display()))?;
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

fn osu_binary(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    let dir = std::env::temp_dir().join(format!("shmfab-osu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("osu_style.c");
    let bin = dir.join("osu_style");
    std::fs::write(&src, OSU_SOURCE).ok()?;
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
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT", "1");
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let c = CompareArgs { sizes: a.sizes.clone(), json: a.json.clone(), osu, rounds: a.rounds };
        return cmd_compare(&c);
    }
    let m = match a.what {
        What::Wakeup => return cmd_wakeup(a),
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

/// One row of the figures JSON: a system's figures for one size (absent
/// figures are null).
#[derive(Debug, PartialEq, Serialize)]
struct Row<'a> {
    size: usize,
    system: &'a str,
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

/// Largest message the raw floor moves (one page less its flags).
const RAW_MAX: usize = 3968;

/// Progress steps of one round of `compare`.
fn round_steps(sizes: &[usize], osu: bool) -> usize {
    2 * sizes.len() + sizes.iter().filter(|&&s| s <= RAW_MAX).count() + usize::from(osu)
}

/// One round of `compare`: shmfab, the raw floor, Open MPI, libfabric shm.
fn compare_round(o: &CompareArgs, sizes: &[usize], exe: &Path, st: &mut Status) -> Result<[Vec<Figure>; 4], String> {
    st.say("measuring shmfab ...");
    let ours = measure(sizes, Measures { lat: true, bw: true, rate: true }, st)?;
    st.say("measuring the raw shared-page floor ...");
    let mut raw = none_for(sizes);
    for f in raw.iter_mut().filter(|f| f.size <= RAW_MAX) {
        st.step(&format!("raw floor, {}", bytes(f.size)));
        match bench::raw_pingpong(exe, &[], f.size, bench::iters_for(f.size)) {
            Ok(v) => f.half_rtt_us = Some(v),
            Err(e) => st.warn(&format!("raw floor, {} B: {e}", f.size)),
        }
    }
    let ompi = match &o.osu {
        Some(p) => {
            st.say("measuring Open MPI (vader BTL) ...");
            st.step("Open MPI, all sizes");
            bench::openmpi(p, sizes).unwrap_or_else(|e| {
                st.warn(&format!("Open MPI: {e}"));
                none_for(sizes)
            })
        }
        None => none_for(sizes),
    };
    st.say("measuring libfabric shm (fi_pingpong) ...");
    let mut fi = none_for(sizes);
    for f in fi.iter_mut() {
        st.step(&format!("fi_pingpong, {}", bytes(f.size)));
        match bench::fi_pingpong(f.size, bench::iters_for(f.size).min(20000)) {
            Ok(v) => f.half_rtt_us = Some(v),
            Err(e) => st.warn(&format!("fi_pingpong, {} B: {e}", f.size)),
        }
    }
    Ok([ours, raw, ompi, fi])
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

/// Figure by figure, the median over rounds.
fn median_figures(rounds: &[Vec<Figure>]) -> Vec<Figure> {
    let pick = |i: usize, get: fn(&Figure) -> Option<f64>| median(rounds.iter().filter_map(|r| get(&r[i])).collect());
    (0..rounds[0].len())
        .map(|i| Figure {
            size: rounds[0][i].size,
            half_rtt_us: pick(i, |f| f.half_rtt_us),
            bw_gbs: pick(i, |f| f.bw_gbs),
            mmsgs: pick(i, |f| f.mmsgs),
        })
        .collect()
}

fn cmd_compare(o: &CompareArgs) -> Result<(), String> {
    if let Some(p) = &o.json {
        check_json_path(p)?;
    }
    let exe = exe()?;
    let sizes = o.sizes.get();
    // The systems take turns, round after round, so that a slow spell of
    // the machine touches each of them; each figure is the median.
    let mut per_sys: [Vec<Vec<Figure>>; 4] = Default::default();
    let mut st = Status::new(o.rounds * round_steps(&sizes, o.osu.is_some()));
    for r in 0..o.rounds {
        st.say(&format!("round {} of {}", r + 1, o.rounds));
        for (all, one) in per_sys.iter_mut().zip(compare_round(o, &sizes, &exe, &mut st)?) {
            all.push(one);
        }
    }
    st.finish();
    let [ours, raw, ompi, fi] = per_sys.map(|r| median_figures(&r));
    println!();
    println!(
        "{:>8} | {:>9} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6} | {:>7} {:>7} {:>6} | {:>6} {:>6} {:>6}",
        "size",
        "shmfab",
        "raw",
        "/raw",
        "ompi",
        "/ompi",
        "fi-shm",
        "/fi",
        "shmfab",
        "ompi",
        "/ompi",
        "shmfab",
        "ompi",
        "/ompi"
    );
    println!("{:>8} | {:^49} | {:^22} | {:^20}", "(bytes)", "half round-trip (us)", "bandwidth (GB/s)", "Mmsg/s");
    for i in 0..sizes.len() {
        let (s, r, m, f) = (&ours[i], &raw[i], &ompi[i], &fi[i]);
        println!(
            "{:>8} | {:>9} {:>9} {:>6} {:>9} {:>6} {:>9} {:>6} | {:>7} {:>7} {:>6} | {:>6} {:>6} {:>6}",
            s.size,
            fmt(s.half_rtt_us, 3),
            fmt(r.half_rtt_us, 3),
            ratio(s.half_rtt_us, r.half_rtt_us),
            fmt(m.half_rtt_us, 3),
            ratio(s.half_rtt_us, m.half_rtt_us),
            fmt(f.half_rtt_us, 3),
            ratio(s.half_rtt_us, f.half_rtt_us),
            fmt(s.bw_gbs, 2),
            fmt(m.bw_gbs, 2),
            ratio(s.bw_gbs, m.bw_gbs),
            fmt(s.mmsgs, 2),
            fmt(m.mmsgs, 2),
            ratio(s.mmsgs, m.mmsgs),
        );
    }
    println!(
        "\nmedians of {} rounds; ratios are shmfab / peer: below 1 is better for latency, above 1 for bandwidth and rate",
        o.rounds
    );
    if let Some(p) = &o.json {
        let systems = [("shmfab", &ours[..]), ("raw", &raw[..]), ("openmpi", &ompi[..]), ("libfabric-shm", &fi[..])];
        write_json(p, &rows(&systems))?;
    }
    Ok(())
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
    println!(
        "thresholds: with single copy: inline up to {} B, eager through the pool below {} B (fragments of {} B), rendezvous + CMA from {} B (split between both sides from {} B);",
        cfg.inline_max.min(cfg.cma_min - 1), cfg.cma_min, cfg.frag_size, cfg.cma_min, cfg.split_min
    );
    println!(
        "            without: inline up to {} B, eager through the pool below {} B, rendezvous through the pool from {} B",
        cfg.inline_max, cfg.rndv_min, cfg.rndv_min
    );
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
        assert_eq!((c.rounds, c.osu), (5, None));
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
    fn json_rows_keep_their_field_names_and_six_decimals() {
        let figs = [Figure { size: 8, half_rtt_us: Some(0.123_456_789), bw_gbs: None, mmsgs: Some(6.5) }];
        let raw = [Figure { size: 8, half_rtt_us: Some(0.05), ..Default::default() }];
        let v = serde_json::to_value(rows(&[("shmfab", &figs), ("raw", &raw)])).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"size": 8, "system": "shmfab", "half_rtt_us": 0.123457, "bw_gbs": null, "mmsgs": 6.5},
                {"size": 8, "system": "raw", "half_rtt_us": 0.05, "bw_gbs": null, "mmsgs": null},
            ])
        );
        let text = serde_json::to_string(&rows(&[("shmfab", &figs)])).unwrap();
        assert!(text.starts_with(r#"[{"size":8,"system":"shmfab","half_rtt_us":"#), "{text}");
    }

    #[test]
    fn median_of_odd_even_and_missing() {
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn median_figures_take_each_field_over_the_rounds_that_have_it() {
        let f = |h: Option<f64>, b: Option<f64>| Figure { size: 8, half_rtt_us: h, bw_gbs: b, mmsgs: None };
        let rounds = vec![vec![f(Some(0.3), None)], vec![f(Some(0.1), Some(2.0))], vec![f(Some(0.2), None)]];
        let m = median_figures(&rounds);
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].size, m[0].half_rtt_us, m[0].bw_gbs, m[0].mmsgs), (8, Some(0.2), Some(2.0), None));
    }
}
