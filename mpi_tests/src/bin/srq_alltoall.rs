//! All-to-all message rate and memory per rank by receive model:
//!
//!   srq_alltoall MODE [MESSAGES_PER_PEER] [DEPTH] [BUF]
//!
//! MODE a: one receive endpoint per rank, untagged receives from an SRQ of
//!         DEPTH buffers (default 128);
//!      b: one receive endpoint per peer (connection style), each with its
//!         own queue of DEPTH/2 buffers;
//!      c: one receive endpoint per peer, all bound to one SRQ of DEPTH.
//! Every rank sends MESSAGES_PER_PEER (default 20000) 8-byte messages to
//! every other rank, interleaved, while it receives and reposts; each
//! message is checked (sender, per-connection order). Rank 0 prints one
//! line: the aggregate rate, and memory per rank: receive buffers posted,
//! shared memory allocated (measured from the job's regions, by `scan`,
//! averaged over ranks, with the computed figure beside it) and its RSS.
//! Needs SHMFAB_MAX_EPS >= N + 2 for b and c.

use shmfab::internal::footprint::{per_rank, RecvModel};
use shmfab::*;
use shmfab_mpi_tests::*;
use std::time::Instant;

const T_ADDR: u64 = 0x5151_0000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("a").to_string();
    let m: usize = args.get(1).and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let depth: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(128);
    let buf_len: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(4096);
    let w = world();
    let (n, r) = (w.size, w.rank);
    if !["a", "b", "c"].contains(&mode.as_str()) || n < 2 || depth < 2 || buf_len < 8 {
        fail(&w, "usage: srq_alltoall a|b|c [MESSAGES_PER_PEER] [DEPTH>=2] [BUF>=8], at least 2 ranks");
    }
    let peers: Vec<usize> = (0..n).filter(|&q| q != r).collect();
    let rcq = w.dom.cq_open(&CqAttr { size: 1 << 16, ..Default::default() }).unwrap_or_else(|e| fail(&w, e));
    let srq = w
        .dom
        .srq_open(&SrqAttr { max_recv: depth, low_watermark: 0 })
        .unwrap_or_else(|e| fail(&w, format!("srq: {e}")));
    let n_eps = if mode == "a" { 1 } else { n - 1 };
    let eps: Vec<Endpoint> = (0..n_eps)
        .map(|_| {
            let ep = w.dom.endpoint().unwrap_or_else(|e| fail(&w, format!("endpoint (raise SHMFAB_MAX_EPS?): {e}")));
            ep.bind_cq(&rcq, FI_TRANSMIT | FI_RECV).unwrap_or_else(|e| fail(&w, e));
            ep.bind_av(&w.av).unwrap_or_else(|e| fail(&w, e));
            if mode != "b" {
                ep.bind_srq(&srq).unwrap_or_else(|e| fail(&w, e));
            }
            ep.enable().unwrap_or_else(|e| fail(&w, e));
            ep
        })
        .collect();
    // Receive endpoint k serves peer peers[k] (or all, in mode a).
    let ep_for = |q: usize| if mode == "a" { 0 } else { peers.iter().position(|&p| p == q).unwrap() };
    // Tell every peer which of our endpoints to send to; learn theirs.
    for &q in &peers {
        let a = eps[ep_for(q)].getname().to_bytes();
        post(&w, || w.ep.tinject(&a, w.addr(q), T_ADDR));
    }
    let mut dest = vec![0 as FiAddr; n];
    for &q in &peers {
        let mut b = [0u8; Address::SIZE];
        // SAFETY: b lives until the completion waited for below.
        post(&w, || unsafe { w.ep.trecv(&mut b, w.addr(q), T_ADDR, 0, 7) });
        done(&w, 7);
        dest[q] = w.av.insert_bytes(&b).unwrap_or_else(|e| fail(&w, e));
    }
    // Post the receive buffers; cookie = endpoint << 32 | buffer.
    let per_ep = if mode == "b" { (depth / 2).max(1) } else { depth };
    let n_bufs = if mode == "b" { per_ep * n_eps } else { depth };
    let mut bufs = vec![vec![0u8; buf_len]; n_bufs];
    let repost = |bufs: &mut Vec<Vec<u8>>, cookie: usize| {
        let (k, i) = (cookie >> 32, cookie & 0xffff_ffff);
        // SAFETY: bufs outlive every completion (all read before the end).
        let r = unsafe {
            if mode == "b" {
                eps[k].recv(&mut bufs[i], w.addr(peers[k]), cookie)
            } else {
                srq.post(&mut bufs[i], cookie)
            }
        };
        r.unwrap_or_else(|e| fail(&w, format!("repost: {e}")));
    };
    for i in 0..n_bufs {
        let k = if mode == "b" { i / per_ep } else { 0 };
        repost(&mut bufs, k << 32 | i);
    }
    let posted_bytes = n_bufs * buf_len;
    w.barrier().unwrap_or_else(|e| fail(&w, e));
    // Every rank is set up: measure the job's shared memory now.
    let shm = if r == 0 {
        let job = shmfab::internal::region::job_hash(&w.job);
        use std::os::unix::fs::MetadataExt;
        shmfab::internal::region::scan(Some(job))
            .iter()
            .filter_map(|x| std::fs::metadata(x.id.path()).ok())
            .map(|md| md.blocks() * 512)
            .sum::<u64>()
    } else {
        0
    };
    w.barrier().unwrap_or_else(|e| fail(&w, e));
    let t0 = Instant::now();
    let total_send = m * peers.len();
    let total_recv = m * peers.len();
    let (mut sent, mut got) = (0usize, 0usize);
    let mut next_seq = vec![0u32; n];
    let mut e = [CqTaggedEntry::default(); 64];
    let mut src = [0 as FiAddr; 64];
    let mut idle = 0u32;
    while sent < total_send || got < total_recv {
        let mut moved = false;
        // Send as many as the rings take, interleaved over the peers.
        while sent < total_send {
            let q = peers[sent % peers.len()];
            let seq = (sent / peers.len()) as u32;
            let mut msg = [0u8; 8];
            msg[..4].copy_from_slice(&(r as u32).to_le_bytes());
            msg[4..].copy_from_slice(&seq.to_le_bytes());
            match w.ep.inject(&msg, dest[q]) {
                Ok(()) => {
                    sent += 1;
                    moved = true;
                }
                Err(x) if x.kind() == ErrorKind::Again => break,
                Err(x) => fail(&w, format!("inject: {x}")),
            }
            if sent % 64 == 0 {
                break; // let the receive side keep up
            }
        }
        match rcq.readfrom(&mut e, &mut src) {
            Ok(k) => {
                moved = true;
                for (x, s) in e[..k].iter().zip(&src[..k]) {
                    let i = x.op_context & 0xffff_ffff;
                    let b = &bufs[i];
                    let from = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
                    let seq = u32::from_le_bytes(b[4..8].try_into().unwrap());
                    if x.len != 8 || from >= n || w.rank_of(*s) != Some(from) || seq != next_seq[from] {
                        fail(&w, format!("bad message: len {} from {from} seq {seq}", x.len));
                    }
                    next_seq[from] += 1;
                    got += 1;
                    repost(&mut bufs, x.op_context);
                }
            }
            Err(x) if x.kind() == ErrorKind::Again => {}
            Err(x) if x.kind() == ErrorKind::Avail => {
                fail(&w, format!("error completion: {}", rcq.last_error_text().unwrap_or_default()))
            }
            Err(x) => fail(&w, format!("cq: {x}")),
        }
        if moved {
            idle = 0;
        } else {
            idle += 1;
            if idle > 64 {
                w.dom.wait(Some(std::time::Duration::from_micros(200)));
            }
        }
    }
    w.barrier().unwrap_or_else(|e| fail(&w, e));
    let secs = t0.elapsed().as_secs_f64();
    if r == 0 {
        let cfg = shmfab::proto::Config::from_env().unwrap_or_else(|e| fail(&w, e));
        let model = match mode.as_str() {
            "a" => RecvModel::SharedQueue { depth },
            "b" => RecvModel::PerPeerQueues { depth: per_ep },
            _ => RecvModel::PerPeerEndpointsSrq { depth },
        };
        let f = per_rank(&cfg, n, model, buf_len);
        // The World's own two endpoints come on top of the model's.
        let computed = f.shared + 2 * cfg.geometry.section_size();
        let rss = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| l.to_string()))
            .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
            .unwrap_or(0);
        println!(
            "srq_alltoall mode {mode} N={n} msgs/peer={m}: {:.2} Mmsg/s aggregate; per rank: buffers {} KiB, \
             shm {} KiB (computed {} KiB), RSS {} KiB",
            (n * total_recv) as f64 / secs / 1e6,
            posted_bytes / 1024,
            shm / n as u64 / 1024,
            computed / 1024,
            rss
        );
    }
    drop(eps);
}
