//! The `shmfab` command: benchmarks between two processes it starts itself,
//! the side-by-side comparison with the installed peers, region cleanup and
//! facts about the node.

use shmfab_tools::bench::{self, Figure, Link};
use std::io::Write;
use std::path::{Path, PathBuf};

const USAGE: &str = "usage:
  shmfab run -n N [--bind core|numa|none] -- PROGRAM [ARGS]
      start N ranks of PROGRAM (shmfab's own launcher; ranks join with shmfab::World)
  shmfab bench [pingpong|bw|msgrate|all|wakeup] [--sizes 8,64,...] [--json FILE] [--compare [--rounds N]]
      two processes (this one and a peer it starts) over shmfab; --compare adds
      the installed peers side by side (as shmfab compare)
  shmfab compare [--sizes 8,64,...] [--json FILE] [--osu PATH] [--rounds N]
      shmfab, the raw shared-page floor, Open MPI (osu-style program at PATH)
      and libfabric shm (fi_pingpong) side by side, with shmfab's ratios;
      the systems take turns for N rounds (default 3), each figure the median
  shmfab inspect [JOB]
      what a live job's regions hold (JOB: a job id or its 8-hex hash; default: all)
  shmfab clean [--dry-run]
      remove this user's regions whose owners are dead
  shmfab info [--ranks N,...] [--depth D] [--buf BYTES]
      version, layout, thresholds in force, CMA, /dev/shm, and memory per
      rank for N ranks (default 2,8,64,256; SRQ depth D default 128, per-peer
      queue depth D/2, buffers default 4K)";

/// Window of the message-rate test: osu_mbw_mr's default.
const RATE_WINDOW: usize = 64;

const DEFAULT_SIZES: [usize; 7] = [8, 64, 1024, 4096, 65536, 1 << 20, 4 << 20];

fn main() {
    if std::env::var_os(bench::PEER_ENV).is_some() {
        std::process::exit(bench::peer_main());
    }
    if std::env::var_os("SHMFAB_RAW_PEER").is_some() {
        std::process::exit(bench::raw_peer_main());
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shmfab: {e}");
            1
        }
    };
    std::process::exit(code);
}

#[derive(Clone)]
struct Opts {
    sizes: Vec<usize>,
    json: Option<PathBuf>,
    osu: Option<PathBuf>,
    dry_run: bool,
    compare: bool,
    what: Option<String>,
    ranks: Vec<usize>,
    depth: usize,
    buf: usize,
    rounds: usize,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        sizes: DEFAULT_SIZES.to_vec(),
        json: None,
        osu: None,
        dry_run: false,
        compare: false,
        what: None,
        ranks: vec![2, 8, 64, 256],
        depth: 128,
        buf: 4096,
        rounds: 3,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--sizes" => {
                let v = it.next().ok_or("--sizes needs a list")?;
                o.sizes =
                    v.split(',').map(|s| parse_size(s).ok_or(format!("bad size {s:?}"))).collect::<Result<_, _>>()?;
                if let Some(s) = o.sizes.iter().find(|&&s| s > bench::MAX_SIZE) {
                    return Err(format!("size {s} is above the {} limit", bench::MAX_SIZE));
                }
            }
            "--json" => o.json = Some(it.next().ok_or("--json needs a file")?.into()),
            "--osu" => o.osu = Some(it.next().ok_or("--osu needs a path")?.into()),
            "--ranks" => {
                let v = it.next().ok_or("--ranks needs a list")?;
                o.ranks = v
                    .split(',')
                    .map(|s| s.trim().parse::<usize>().ok().filter(|&n| (1..=1 << 16).contains(&n)))
                    .collect::<Option<_>>()
                    .ok_or(format!("bad --ranks {v:?}: numbers 1..=65536"))?;
            }
            "--depth" => {
                let v = it.next().ok_or("--depth needs a number")?;
                o.depth = v.parse().ok().filter(|&d| d >= 2).ok_or(format!("bad --depth {v:?}"))?;
            }
            "--buf" => {
                let v = it.next().ok_or("--buf needs a size")?;
                o.buf = parse_size(v).filter(|&b| b > 0).ok_or(format!("bad --buf {v:?}"))?;
            }
            "--rounds" => {
                let v = it.next().ok_or("--rounds needs a number")?;
                o.rounds =
                    v.parse().ok().filter(|r| (1..=50).contains(r)).ok_or(format!("bad --rounds {v:?}: 1..=50"))?;
            }
            "--dry-run" => o.dry_run = true,
            "--compare" => o.compare = true,
            "-h" | "--help" => return Err(USAGE.into()),
            w if !w.starts_with('-') && o.what.is_none() => o.what = Some(w.to_string()),
            w => return Err(format!("unknown argument {w:?}\n{USAGE}")),
        }
    }
    Ok(o)
}

fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (n, m) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1024),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<usize>().ok().map(|n| n * m)
}

fn run(args: &[String]) -> Result<(), String> {
    let Some(cmd) = args.first() else {
        return Err(USAGE.into());
    };
    if cmd == "run" {
        return cmd_run(&args[1..]);
    }
    let o = parse(&args[1..])?;
    match cmd.as_str() {
        "bench" => cmd_bench(&o),
        "compare" => cmd_compare(&o),
        "clean" => {
            let dead = shmfab::internal::region::clean_dead(o.dry_run);
            for r in &dead {
                let verb = if o.dry_run { "would remove" } else { "removed" };
                println!("{verb} {} (owner pid {} dead, {} bytes)", r.name, r.pid, r.size);
            }
            if dead.is_empty() {
                println!("no regions of dead owners");
            }
            Ok(())
        }
        "info" => {
            cmd_info(&o);
            Ok(())
        }
        "inspect" => {
            let job = o.what.as_deref().map(shmfab_tools::inspect::job_arg);
            print!("{}", shmfab_tools::inspect::inspect(job).map_err(|e| e.to_string())?);
            Ok(())
        }
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        c => Err(format!("unknown command {c:?}\n{USAGE}")),
    }
}

fn cmd_run(args: &[String]) -> Result<(), String> {
    let split = args
        .iter()
        .position(|a| a == "--")
        .ok_or_else(|| format!("shmfab run needs -- before the program\n{USAGE}"))?;
    let (opts, prog) = (&args[..split], &args[split + 1..]);
    let mut n = None;
    let mut bind = shmfab_tools::run::Bind::None;
    let mut it = opts.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-n" | "--np" => n = Some(it.next().and_then(|v| v.parse::<usize>().ok()).ok_or("-n takes a number")?),
            "--bind" => {
                bind = it
                    .next()
                    .ok_or("--bind takes core, numa or none")?
                    .parse()
                    .map_err(|e: shmfab::Error| e.to_string())?
            }
            w => return Err(format!("unknown run option {w:?}\n{USAGE}")),
        }
    }
    let n = n.ok_or("shmfab run needs -n N")?;
    let code = shmfab_tools::run::run(n, bind, prog).map_err(|e| e.to_string())?;
    std::process::exit(code);
}

fn exe() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))
}

/// The two ranks of a launcher (mpirun, shmfab run -n 2), if this process
/// is one of them: rank 0 measures, rank 1 serves it (and exits here).
fn launched_pair() -> Result<Option<shmfab::World>, String> {
    let l = shmfab::internal::job::Launch::detect().map_err(|e| e.to_string())?;
    if l.launcher == shmfab::internal::job::Launcher::Single {
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

/// shmfab's own figures for `sizes`: any of latency, bandwidth, rate.
fn measure(sizes: &[usize], lat: bool, bw: bool, rate: bool) -> Result<Vec<Figure>, String> {
    let world = launched_pair()?;
    let mut link = match &world {
        Some(w) => Link::with_world(w),
        None => Link::spawn(&exe()?, &[]),
    }
    .map_err(|e| e.to_string())?;
    let tty = atty_stderr();
    let mut out = Vec::new();
    for &size in sizes {
        let mut f = Figure { size, ..Default::default() };
        if tty {
            eprint!("\r  measuring {size} B ...        ");
        }
        if lat {
            f.half_rtt_us = Some(link.pingpong(size, bench::iters_for(size)).map_err(|e| e.to_string())?);
        }
        if bw {
            let w = Link::window_for(size);
            let it = (bench::iters_for(size) / w).max(10);
            f.bw_gbs = Some(link.stream(size, w, it).map_err(|e| e.to_string())?.0);
        }
        if rate && size <= 64 {
            f.mmsgs = Some(link.stream(size, RATE_WINDOW, 2000).map_err(|e| e.to_string())?.1);
        }
        out.push(f);
    }
    if tty {
        eprint!("\r                                  \r");
    }
    link.quit().map_err(|e| e.to_string())?;
    Ok(out)
}

fn atty_stderr() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

fn fmt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

/// The osu-style MPI program, built here with mpicc when none was given.
const OSU_SOURCE: &str = include_str!("../../mpi_tests/osu_style.c");

fn osu_binary(o: &Opts) -> Option<PathBuf> {
    if o.osu.is_some() {
        return o.osu.clone();
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

fn cmd_bench(o: &Opts) -> Result<(), String> {
    if o.compare {
        let osu = osu_binary(o);
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT", "1");
        std::env::set_var("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let with = Opts { osu, dry_run: false, compare: true, what: None, ..o.clone() };
        return cmd_compare(&with);
    }
    let what = o.what.as_deref().unwrap_or("all");
    if what == "wakeup" {
        return cmd_wakeup(o);
    }
    let (lat, bw, rate) = match what {
        "pingpong" => (true, false, false),
        "bw" => (false, true, false),
        "msgrate" => (false, false, true),
        "all" => (true, true, true),
        w => return Err(format!("unknown benchmark {w:?}\n{USAGE}")),
    };
    let sizes: Vec<usize> = if what == "msgrate" && o.sizes == DEFAULT_SIZES { vec![8] } else { o.sizes.clone() };
    println!("shmfab {} between two processes ({} CPUs)", env!("CARGO_PKG_VERSION"), bench::ncpus());
    let figs = measure(&sizes, lat, bw, rate)?;
    println!("{:>10} {:>14} {:>12} {:>12}", "size (B)", "half RTT (us)", "bw (GB/s)", "Mmsg/s");
    for f in &figs {
        println!("{:>10} {:>14} {:>12} {:>12}", f.size, fmt(f.half_rtt_us, 3), fmt(f.bw_gbs, 2), fmt(f.mmsgs, 2));
    }
    if let Some(p) = &o.json {
        write_json(p, &figs.iter().map(|f| ("shmfab", *f)).collect::<Vec<_>>())?;
    }
    Ok(())
}

/// Wake-up latency of a receiver asleep in sread against a raw futex wake
/// between two processes, and the CPU an idle blocked rank uses.
fn cmd_wakeup(o: &Opts) -> Result<(), String> {
    let tries = 200;
    let gap = std::time::Duration::from_millis(2);
    let mut link = Link::spawn(&exe()?, &[]).map_err(|e| e.to_string())?;
    let ours = bench::median(link.wakeups(tries, gap).map_err(|e| e.to_string())?);
    let secs: u64 = std::env::var("SHMFAB_IDLE_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
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
    if let Some(p) = &o.json {
        let body =
            format!("{{\"shmfab_wake_us\":{ours:.3},\"raw_futex_wake_us\":{raw:.3},\"idle_cpu_percent\":{idle:.4}}}\n");
        std::fs::write(p, body).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    Ok(())
}

fn write_json(path: &PathBuf, rows: &[(&str, Figure)]) -> Result<(), String> {
    let num = |v: Option<f64>| v.map_or("null".to_string(), |x| format!("{x:.6}"));
    let body: Vec<String> = rows
        .iter()
        .map(|(sys, f)| {
            format!(
                "{{\"size\":{},\"system\":\"{}\",\"half_rtt_us\":{},\"bw_gbs\":{},\"mmsgs\":{}}}",
                f.size,
                sys,
                num(f.half_rtt_us),
                num(f.bw_gbs),
                num(f.mmsgs)
            )
        })
        .collect();
    let mut file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(file, "[{}]", body.join(",\n ")).map_err(|e| e.to_string())
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

/// One round of `compare`: shmfab, the raw floor, Open MPI, libfabric shm.
fn compare_round(o: &Opts, exe: &Path) -> Result<[Vec<Figure>; 4], String> {
    println!("measuring shmfab ...");
    let ours = measure(&o.sizes, true, true, true)?;
    println!("measuring the raw shared-page floor ...");
    let mut raw = none_for(&o.sizes);
    for f in raw.iter_mut().filter(|f| f.size <= 3968) {
        match bench::raw_pingpong(exe, &[], f.size, bench::iters_for(f.size)) {
            Ok(v) => f.half_rtt_us = Some(v),
            Err(e) => eprintln!("raw floor, {} B: {e}", f.size),
        }
    }
    let ompi = match &o.osu {
        Some(p) => {
            println!("measuring Open MPI (vader BTL) ...");
            bench::openmpi(p, &o.sizes).unwrap_or_else(|e| {
                eprintln!("Open MPI: {e}");
                none_for(&o.sizes)
            })
        }
        None => none_for(&o.sizes),
    };
    println!("measuring libfabric shm (fi_pingpong) ...");
    let mut fi = none_for(&o.sizes);
    for f in fi.iter_mut() {
        match bench::fi_pingpong(f.size, bench::iters_for(f.size).min(20000)) {
            Ok(v) => f.half_rtt_us = Some(v),
            Err(e) => eprintln!("fi_pingpong, {} B: {e}", f.size),
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

fn cmd_compare(o: &Opts) -> Result<(), String> {
    let exe = exe()?;
    // The systems take turns, round after round, so that a slow spell of
    // the machine touches each of them; each figure is the median.
    let mut per_sys: [Vec<Vec<Figure>>; 4] = Default::default();
    for r in 0..o.rounds {
        println!("round {} of {}", r + 1, o.rounds);
        for (all, one) in per_sys.iter_mut().zip(compare_round(o, &exe)?) {
            all.push(one);
        }
    }
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
    for i in 0..o.sizes.len() {
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
        let mut rows = Vec::new();
        for (sys, figs) in [("shmfab", &ours), ("raw", &raw), ("openmpi", &ompi), ("libfabric-shm", &fi)] {
            rows.extend(figs.iter().map(|f| (sys, *f)));
        }
        write_json(p, &rows)?;
    }
    Ok(())
}

fn cmd_info(o: &Opts) {
    let cfg = shmfab::proto::Config::from_env();
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
        "thresholds: with single copy: inline below {} B, rendezvous + CMA from {} B (split between both sides from {} B);",
        cfg.cma_min, cfg.cma_min, cfg.split_min
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
    match rustix::fs::statvfs("/dev/shm") {
        Ok(s) => println!(
            "/dev/shm: {} MiB, {} MiB free",
            s.f_blocks * s.f_frsize / (1 << 20),
            s.f_bavail * s.f_frsize / (1 << 20)
        ),
        Err(e) => println!("/dev/shm: cannot stat: {e}"),
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
}

/// Memory per rank for each N, by receive model (see shmfab::internal::footprint).
fn print_footprint(cfg: &shmfab::proto::Config, o: &Opts) {
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
