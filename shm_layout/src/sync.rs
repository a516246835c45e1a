//! The atomics every shared type uses: std's, or loom's under `cfg(loom)`,
//! so that the ring, doorbell and pool protocols can be model-checked with
//! the very types that live in shared memory.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
