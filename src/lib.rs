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

pub mod av;
pub mod bench;
pub mod cma;
pub mod cntr;
pub mod cq;
pub mod domain;
pub mod doorbell;
pub mod ep;
pub mod error;
pub mod fdwait;
pub mod flags;
pub mod footprint;
pub mod inspect;
pub mod job;
pub mod launch;
pub mod notify;
pub mod ovf;
pub mod poll;
pub mod pool;
mod progress;
pub mod proto;
pub mod region;
pub mod ring;
pub mod run;
pub mod snapshot;
pub mod srq;
pub mod sync;
pub mod topo;

pub use av::AddressVector;
pub use cntr::Counter;
pub use cq::{
    CompletionQueue, CqAttr, CqDataEntry, CqEntry, CqErrEntry, CqFormat, CqMsgEntry, CqTaggedEntry, WaitCond, WaitObj,
};
pub use domain::{Domain, Fabric};
pub use ep::{Endpoint, EpStats, RecvMsg, SendMsg};
pub use error::{Error, ErrorKind, Result};
pub use flags::*;
pub use job::Launcher;
pub use launch::World;
pub use notify::CompletionChannel;
pub use poll::{PollSet, WaitSet};
pub use shm_layout::Address;
pub use srq::{SharedRecvQueue, SrqAttr, SrqEvent, SrqInfo};
pub use sync::Threading;
