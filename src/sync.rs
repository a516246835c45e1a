//! Atomics for the lock-free protocols: std's, or loom's under `cfg(loom)`
//! (re-exported from `shm_layout::sync`, so shared types and the code that
//! drives them use the same ones).

pub use shm_layout::sync::{fence, AtomicU32, AtomicU64, Ordering};
