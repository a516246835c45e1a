//! One-sided operations between two domains of one process, for counting
//! the instructions of their hot paths under callgrind (the software of
//! `shmfab bench rma`'s latency runs, without the cache-line transfers):
//! `rounds` times each of an 8 B put, an 8 B get and a fetch-add (u64 SUM)
//! into the other domain's shared heap, each followed by the CQ read that
//! finds its completion, as the benchmark does.
//!
//! `iput` is an 8 B `inject_write` (no completion entry: done when the
//! call returns, as every shmfab RMA), `cput` and `cget` a write and a
//! read counted on a transmit counter, each waited for by reading it
//! (the forms an MPI one-sided layer over libfabric uses to flush).
//!
//! `hput`, `hget` and `hfadd` are the same three through a
//! [`shmfab::HeapTarget`] (the registration resolved once; done when the
//! call returns, no completion entry).
//!
//! Usage: `rma_ops [put|get|fadd|iput|cput|cget|cfadd|hput|hget|hfadd] [rounds]` (default:
//! put, 100000).
//! Instructions per operation:
//! `valgrind --tool=callgrind --callgrind-out-file=F target/release/examples/rma_ops put 100000`,
//! then `callgrind_annotate F` (PROGRAM TOTALS / rounds; setup included).

use shmfab::{AtomicOp, AtomicType, CqAttr, CqTaggedEntry, Fabric, FI_READ, FI_RECV, FI_REMOTE_READ};
use shmfab::{FI_REMOTE_WRITE, FI_SEND, FI_TRANSMIT, FI_WRITE};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "put".into());
    let n: usize = args.next().map_or(Ok(100_000), |a| a.parse())?;
    std::env::set_var("SHMFAB_JOB_ID", format!("rma-ops-{}", std::process::id()));
    let fab = Fabric::open()?;
    let (d0, d1) = (fab.domain()?, fab.domain()?);
    let cq = d0.cq_open(&CqAttr::default())?;
    let av = d0.av_open()?;
    let (ep0, ep1) = (d0.endpoint()?, d1.endpoint()?);
    ep0.bind_cq(&cq, FI_TRANSMIT | FI_RECV)?;
    ep0.bind_av(&av)?;
    ep0.enable()?;
    let (cq1, av1) = (d1.cq_open(&CqAttr::default())?, d1.av_open()?);
    ep1.bind_cq(&cq1, FI_TRANSMIT | FI_RECV)?;
    ep1.bind_av(&av1)?;
    ep1.enable()?;
    // A second initiator, counting its transmits on a counter, no CQ.
    let (epc, cntr) = (d0.endpoint()?, d0.cntr_open()?);
    epc.bind_cntr(&cntr, FI_SEND | FI_RECV | FI_WRITE | FI_READ)?;
    epc.bind_av(&av)?;
    epc.enable()?;
    let heap = d1.alloc_shared(4096, FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE)?;
    let a1 = av.insert(&[ep1.getname()])?[0];
    let mut e = [CqTaggedEntry::default(); 1];
    let mut buf = *b"12345678";
    let one = 1u64.to_ne_bytes();
    let mut want = 0u64;
    let h = ep0.heap_target(a1, heap.key())?;
    for _ in 0..n {
        want += 1;
        match what.as_str() {
            "hput" => {
                h.write(0, &buf)?;
                continue;
            }
            "hget" => {
                h.read(0, &mut buf)?;
                continue;
            }
            "hfadd" => {
                h.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut buf, 64)?;
                continue;
            }
            "iput" => {
                ep0.inject_write(&buf, a1, 0, heap.key())?;
                continue;
            }
            "cput" | "cget" | "cfadd" => {
                match what.as_str() {
                    "cput" => epc.write(&buf, a1, 0, heap.key(), 1)?,
                    "cget" => epc.read(&mut buf, a1, 0, heap.key(), 1)?,
                    _ => epc.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut buf, a1, 64, heap.key(), 1)?,
                }
                while cntr.read()? < want {}
                continue;
            }
            "put" => ep0.write(&buf, a1, 0, heap.key(), 1)?,
            "get" => ep0.read(&mut buf, a1, 0, heap.key(), 1)?,
            "fadd" => ep0.fetch_atomic(AtomicType::Uint64, AtomicOp::Sum, &one, &mut buf, a1, 64, heap.key(), 1)?,
            w => return Err(format!("put, get or fadd, not {w}").into()),
        }
        while !matches!(cq.read(&mut e), Ok(1)) {}
    }
    println!("{what}: {n}, stats {:?}", d0.rma_stats());
    Ok(())
}
