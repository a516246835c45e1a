//! The parts of the `shmfab` command (`tools/src/main.rs`) that its tests
//! and benchmarks share: the two-process benchmarks and the raw floor
//! ([`bench`](mod@bench)), the comparison's picture ([`plot`]), `shmfab
//! inspect` ([`inspect`]), the embedded launcher `shmfab run` ([`run`]),
//! the node's topology from hwloc ([`topo`]) and the progress line of long
//! runs ([`status`]). The provider
//! itself is the `shmfab` library; this crate reaches its low-level parts
//! through `shmfab::internal`.
//!
//! ```
//! assert_eq!(shmfab_tools::run::parse_cpulist("0-2,5"), vec![0, 1, 2, 5]);
//! ```
#![deny(missing_docs)]

pub mod bench;
pub mod inspect;
pub mod plot;
pub mod run;
pub mod status;
pub mod topo;
