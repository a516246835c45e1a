//! shmfab: a kernel-bypass shared-memory communication provider for
//! processes on one node, following libfabric's object model.
//!
//! A [`Domain`] owns one region under /dev/shm; each [`Endpoint`] is a
//! section of it holding SPSC rings (one per sending peer, claimed on first
//! contact), an MPSC overflow queue, and a bounce-buffer pool shared by all
//! inbound peers. Messages travel inline in the rings, pipelined through the
//! pool, or by single copy (process_vm_readv) by size ([`proto`]).
//! Completions go to [`CompletionQueue`]s and [`Counter`]s; progress is
//! manual: reading a CQ or counter drives it.
//!
//! ```
//! use shmfab::{CqAttr, CqTaggedEntry, Fabric, FI_RECV, FI_TRANSMIT, FI_ADDR_UNSPEC};
//! # std::env::set_var("SHMFAB_JOB_ID", format!("doctest-{}", std::process::id()));
//! let fabric = Fabric::open()?;
//! let dom = fabric.domain()?;
//! let cq = dom.cq_open(&CqAttr::default())?;
//! let av = dom.av_open()?;
//! let ep = dom.endpoint()?;
//! ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV)?;
//! ep.bind_av(&av)?;
//! ep.enable()?;
//! let me = av.insert(&[ep.getname()])?[0];
//! let mut buf = [0u8; 5];
//! // SAFETY: buf outlives the receive, which completes below.
//! unsafe { ep.recv(&mut buf, FI_ADDR_UNSPEC, 1)? };
//! ep.inject(b"hello", me)?;
//! let mut e = [CqTaggedEntry::default(); 1];
//! while cq.read(&mut e).is_err() {}
//! assert_eq!((e[0].op_context, e[0].len, &buf), (1, 5, b"hello"));
//! # Ok::<(), shmfab::Error>(())
//! ```
#![deny(missing_docs)]

pub mod atomic;
pub mod av;
mod cma;
pub mod cntr;
pub mod coll;
pub mod copy;
pub mod cq;
pub mod domain;
mod doorbell;
mod engine;
pub mod ep;
pub mod error;
mod fdwait;
pub mod flags;
mod footprint;
mod job;
mod launch;
pub mod mr;
pub mod notify;
mod ovf;
pub mod poll;
mod pool;
mod progress;
pub mod proto;
mod region;
mod ring;
pub mod rma;
mod snapshot;
pub mod srq;
mod sync;
mod table;
pub mod trigger;

pub use atomic::{AtomicCall, AtomicOp, AtomicType};
pub use av::AddressVector;
pub use cntr::{CntrAttr, Counter};
pub use coll::{CollAttr, CollGroup, CollOp};
pub use cq::{
    CompletionQueue, CqAttr, CqDataEntry, CqEntry, CqErrEntry, CqFormat, CqMsgEntry, CqTaggedEntry, WaitCond, WaitObj,
};
pub use domain::{Domain, Fabric};
pub use ep::{Endpoint, EpStats, RecvMsg, SendMsg};
pub use error::{Error, ErrorKind, Result};
pub use fdwait::MutexCond;
pub use flags::*;
pub use job::Launcher;
pub use launch::World;
pub use mr::{MemoryRegion, RmaStats};
pub use notify::CompletionChannel;
pub use poll::{PollSet, WaitSet};
pub use proto::Config;
pub use rma::{AtomicAttr, HeapTarget, RmaIoc, RmaIov};
pub use shm_layout::Address;
pub use srq::{SharedRecvQueue, SrqAttr, SrqEvent, SrqInfo, SRQ_MAX_IOV};
pub use sync::Threading;
pub use trigger::{AtomicMsg, ChainTemplate, DeferredOp, DeferredWork, Trigger, Triggered, WorkChain, WorkId};

/// The crate's low-level parts, for the `shmfab` command (`tools/`), the
/// tests and the benchmarks: not part of the API, and free to change with
/// any commit. Each module here re-exports the public items of the crate
/// module of the same name.
#[doc(hidden)]
pub mod internal {
    /// Single copy between processes (process_vm_readv/writev).
    pub mod cma {
        pub use crate::cma::*;
    }
    /// The futex doorbell of a domain.
    pub mod doorbell {
        pub use crate::doorbell::*;
    }
    /// Memory per rank for N ranks, by receive model (`shmfab info`).
    pub mod footprint {
        pub use crate::footprint::*;
    }
    /// Launcher environment, job id, process identity.
    pub mod job {
        pub use crate::job::*;
    }
    /// The boot region where a job's ranks meet.
    pub mod launch {
        pub use crate::launch::*;
    }
    /// The MPSC overflow queue.
    pub mod ovf {
        pub use crate::ovf::*;
    }
    /// The bounce-buffer pool.
    pub mod pool {
        pub use crate::pool::*;
    }
    /// Regions under /dev/shm: create, attach, scan, clean.
    pub mod region {
        pub use crate::region::*;
    }
    /// The SPSC ring.
    pub mod ring {
        pub use crate::ring::*;
    }
    /// Read-only snapshots of regions (`shmfab inspect`).
    pub mod snapshot {
        pub use crate::snapshot::*;
    }
    /// Atomics (std's, or loom's) and the domain lock.
    pub mod sync {
        pub use crate::sync::*;
    }
}
