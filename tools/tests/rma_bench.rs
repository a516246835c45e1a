//! The one-sided benchmark worker (`shmfab bench rma`, the shmfab part of
//! `shmfab compare`'s RMA tables) on a couple of sizes with few
//! iterations: well-formed JSON rows with positive figures and the path
//! each took, and the data checks that make a broken path fail.

mod common;
use common::{shmfab_env, text};
use shmfab_tools::bench::{Link, RmaMem};
use std::path::PathBuf;
use std::time::Duration;

/// A JSON file in the temp dir, removed on drop.
struct TempJson(PathBuf);

impl TempJson {
    fn new(tag: &str) -> TempJson {
        TempJson(std::env::temp_dir().join(format!("shmfab-rma-bench-{tag}-{}.json", std::process::id())))
    }
}

impl Drop for TempJson {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs `shmfab bench rma` on 8 B and 4 KiB with 50 operations per run
/// and returns its rows.
fn bench_rows(tag: &str, env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let json = TempJson::new(tag);
    let path = json.0.to_str().unwrap().to_string();
    let o = shmfab_env(
        &["bench", "rma", "--sizes", "8,4k", "--iters", "50", "--json", &path],
        env,
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "stdout:\n{}\nstderr:\n{}", text(&o.stdout), text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("fetch-add (8 B, u64 SUM, heap)"), "{out}");
    // The raw floor of the fetch-add rate ran (it checks the word's total).
    let raw = out.lines().find(|l| l.starts_with("raw floor of the fetch-add rate")).unwrap_or_else(|| panic!("{out}"));
    let mops: f64 = raw.rsplit(", ").next().unwrap().trim_end_matches(" Mops/s").parse().unwrap();
    assert!(mops > 0.0, "{raw}");
    serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(&json.0).unwrap())
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Checks the rows: every system at each size, positive figures, and the
/// path of the ordinary-memory rows is `user_path`.
fn check_rows(rows: &[serde_json::Value], user_path: &str) {
    let find = |sys: &str, size: u64| {
        rows.iter()
            .find(|r| r["system"] == sys && r["size"] == size)
            .unwrap_or_else(|| panic!("no {sys} row at {size} B in {rows:?}"))
    };
    let positive = |r: &serde_json::Value, f: &str| {
        let v = r[f].as_f64().unwrap_or_else(|| panic!("{f} missing in {r}"));
        assert!(v > 0.0 && v.is_finite(), "{f} = {v} in {r}");
    };
    for size in [8u64, 4096] {
        for (sys, path) in [
            ("shmfab-put", "heap"),
            ("shmfab-get", "heap"),
            ("shmfab-put-cma", user_path),
            ("shmfab-get-cma", user_path),
        ] {
            let r = find(sys, size);
            assert_eq!((r["path"].as_str(), r["placement"].as_str()), (Some(path), Some("all")), "{r}");
            for f in ["latency_us", "bw_gbs", "mops"] {
                positive(r, f);
            }
            // bw and mops come from the same run: bytes are ops times size.
            let (bw, mops) = (r["bw_gbs"].as_f64().unwrap(), r["mops"].as_f64().unwrap());
            let want = mops * size as f64 / 1e3;
            assert!((bw - want).abs() <= 1e-5 + want * 1e-3, "{r}");
        }
    }
    let f = find("shmfab-fetch-add", 8);
    assert_eq!(f["path"].as_str(), Some("heap"), "{f}");
    positive(f, "latency_us");
    positive(f, "mops");
    assert!(f["bw_gbs"].is_null(), "{f}");
    // The 8 B forms an MPI one-sided layer completes with.
    for sys in ["shmfab-put-inject", "shmfab-put-cntr", "shmfab-get-cntr", "shmfab-fetch-add-cntr", "shmfab-put-handle"]
    {
        let r = find(sys, 8);
        assert_eq!(r["path"].as_str(), Some("heap"), "{r}");
        positive(r, "latency_us");
    }
    // The fetch-adds through a HeapTarget: one rank alone, two ranks.
    let f = find("shmfab-fetch-add-handle", 8);
    positive(f, "latency_us");
    positive(f, "mops");
    assert_eq!(rows.len(), 15, "4 systems x 2 sizes, fetch-add, the 5 forms and the handle's fetch-add: {rows:?}");
}

/// Whether this host lets a process write another with process_vm_writev.
fn cma_works() -> bool {
    let mut x = [0u8; 1];
    let l = libc::iovec { iov_base: [1u8].as_ptr() as *mut _, iov_len: 1 };
    let r = libc::iovec { iov_base: x.as_mut_ptr().cast(), iov_len: 1 };
    // SAFETY: both ranges are ours and valid.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &l, 1, &r, 1, 0) };
    n == 1
}

#[test]
fn bench_rma_writes_well_formed_rows_for_both_paths() {
    let rows = bench_rows("auto", &[]);
    check_rows(&rows, if cma_works() { "cma" } else { "mailbox" });
}

#[test]
fn with_single_copy_off_the_ordinary_memory_rows_say_mailbox() {
    let rows = bench_rows("off", &[("SHMFAB_CMA", "off")]);
    check_rows(&rows, "mailbox");
}

#[test]
fn the_workers_checks_see_data_that_did_not_arrive() {
    let mut link = Link::spawn(std::path::Path::new(env!("CARGO_BIN_EXE_shmfab")), &[]).unwrap();
    link.rma_setup(4096).unwrap();
    for mem in [RmaMem::Heap, RmaMem::User] {
        let (f, _) = link.rma_op(true, mem, 100, 5, 10).unwrap();
        assert!(f.latency_us.unwrap() > 0.0);
        // What the puts left is seed 5's pattern, not seed 6's, nor more
        // bytes of it than were put.
        assert!(link.rma_check(mem, 100, 5).unwrap(), "{mem:?}");
        assert!(!link.rma_check(mem, 100, 6).unwrap(), "{mem:?}");
        assert!(!link.rma_check(mem, 101, 5).unwrap(), "{mem:?}");
        // Gets bring what the peer wrote (checked inside), then the
        // puts' check sees the get's pattern.
        link.rma_op(false, mem, 64, 9, 10).unwrap();
        assert!(link.rma_check(mem, 64, 9).unwrap(), "{mem:?}");
    }
    // Sizes beyond what the peer registered are refused before anything moves.
    let e = link.rma_op(true, RmaMem::Heap, 4097, 1, 10).unwrap_err();
    assert!(e.to_string().contains("set up for 1 to 4096"), "{e}");
    let (f, path) = link.fetch_add(200, false).unwrap();
    assert_eq!(path, "heap");
    assert!(f.mops.unwrap() > 0.0 && f.latency_us.unwrap() > 0.0);
    // The word went on counting: a second run (both ranks through a
    // HeapTarget) checks against the total, and a third after it.
    let (f, _) = link.fetch_add(100, true).unwrap();
    assert!(f.mops.unwrap() > 0.0 && f.latency_us.unwrap() > 0.0);
    link.fetch_add(100, false).unwrap();
    // The MPI-layer forms, the HeapTarget's among them, with their data
    // checked (an error otherwise).
    let forms = link.rma_flush_forms(50, 77).unwrap();
    assert!(forms.put_handle_us > 0.0 && forms.fadd_handle_us > 0.0, "{forms:?}");
    link.fetch_add(100, false).unwrap();
    link.quit().unwrap();
}
