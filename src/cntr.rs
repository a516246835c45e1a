//! Counters as in fi_cntr(3): a success value and an error value, both in
//! the domain's shared region (so remote events can update them later);
//! `read` and `readerr` drive progress first. The application's `add`,
//! `set` and their error twins ring the domain's doorbell when someone
//! sleeps on it, so a waiter ([`Counter::wait`], a wait set holding the
//! counter, an armed fd bridge) wakes at once.

use crate::domain::{Domain, DomainInner};
use crate::engine::complete::{count, set, Val};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::Ordering;
use std::sync::Arc;

pub(crate) struct CntrState {
    /// (value, error) when trywait last looked.
    pub checkpoint: (u64, u64),
}

impl crate::table::Object for CntrState {
    const NAME: &'static str = "counter";
    const BOUND_BY: &'static str = "endpoints, once per direction, or poll or wait sets";
}

/// A counter.
pub struct Counter {
    pub(crate) dom: Arc<DomainInner>,
    pub(crate) id: usize,
    closed: std::sync::atomic::AtomicBool,
}

impl Domain {
    /// Opens a counter (value and error start at 0).
    pub fn cntr_open(&self) -> Result<Counter> {
        let mut st = self.inner.lock()?;
        let n = self.inner.counters().len();
        // The id indexes the region's counter table.
        if st.cntrs.next_id() >= n {
            return Err(Error::with(ErrorKind::NoSpc, format!("all {n} counters of the domain are open")));
        }
        let id = st.cntrs.insert(CntrState { checkpoint: (0, 0) });
        let c = &self.inner.counters()[id];
        set(c, Val::Success, 0);
        set(c, Val::Error, 0);
        Ok(Counter { dom: self.inner.clone(), id, closed: false.into() })
    }
}

impl Counter {
    fn shm(&self) -> Result<&shm_layout::Counter> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "counter is closed"));
        }
        Ok(&self.dom.counters()[self.id])
    }

    fn progress(&self) -> Result<()> {
        let mut st = self.dom.lock()?;
        self.dom.progress(&mut st);
        Ok(())
    }

    /// Success value (after a progress pass).
    pub fn read(&self) -> Result<u64> {
        self.progress()?;
        // SYNC: pairs with the release writes in engine::complete::{count, set}.
        Ok(self.shm()?.value.v.load(Ordering::Acquire))
    }

    /// Error value (after a progress pass).
    pub fn readerr(&self) -> Result<u64> {
        self.progress()?;
        // SYNC: pairs with the release writes in engine::complete::{count, set}.
        Ok(self.shm()?.err.v.load(Ordering::Acquire))
    }

    /// After a change made by the application: wakes whoever sleeps on the
    /// domain's doorbell (nothing to do, no system call, when nobody does).
    /// Completions counted by a progress pass need no ring: that thread is
    /// awake, and the progress thread rings for what it counts.
    fn changed(&self) {
        crate::doorbell::ring(&self.dom.region.header().doorbell);
    }

    /// Adds to the success value (waking its waiters).
    pub fn add(&self, v: u64) -> Result<()> {
        count(self.shm()?, Val::Success, v);
        self.changed();
        Ok(())
    }

    /// Sets the success value (waking its waiters).
    pub fn set(&self, v: u64) -> Result<()> {
        set(self.shm()?, Val::Success, v);
        self.changed();
        Ok(())
    }

    /// Adds to the error value (waking its waiters).
    pub fn adderr(&self, v: u64) -> Result<()> {
        count(self.shm()?, Val::Error, v);
        self.changed();
        Ok(())
    }

    /// Sets the error value (waking its waiters).
    pub fn seterr(&self, v: u64) -> Result<()> {
        set(self.shm()?, Val::Error, v);
        self.changed();
        Ok(())
    }

    /// fi_cntr_wait: waits (sleeping on the doorbell) until the value
    /// reaches `threshold`; `-FI_ETIMEDOUT` after `timeout_ms` (< 0:
    /// forever), `-FI_EAVAIL` if the error value changes meanwhile.
    pub fn wait(&self, threshold: u64, timeout_ms: i32) -> Result<()> {
        let deadline =
            (timeout_ms >= 0).then(|| std::time::Instant::now() + std::time::Duration::from_millis(timeout_ms as u64));
        let err0 = self.shm()?.err.v.load(Ordering::Acquire);
        let dom = crate::Domain { inner: self.dom.clone() };
        loop {
            self.progress()?;
            let c = self.shm()?;
            if c.value.v.load(Ordering::Acquire) >= threshold {
                return Ok(());
            }
            if c.err.v.load(Ordering::Acquire) != err0 {
                return Err(Error::with(ErrorKind::Avail, "the counter's error value changed while waiting"));
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Error::with(
                    ErrorKind::TimedOut,
                    format!("counter below {threshold} after {timeout_ms} ms"),
                ));
            }
            // SYNC: pairs with the release writes in engine::complete; the
            // doorbell's fences order these loads against an add's ring.
            dom.wait_for(left, || {
                c.value.v.load(Ordering::Acquire) >= threshold || c.err.v.load(Ordering::Acquire) != err0
            });
        }
    }

    /// Index of the counter in the domain region's counter table.
    pub fn index(&self) -> usize {
        self.id
    }

    /// Closes the counter; `Busy` while endpoints are bound to it.
    pub fn close(&self) -> Result<()> {
        let mut st = self.dom.lock()?;
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        st.cntrs.close(self.id)?;
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        if self.close().is_err() {
            let Ok(mut st) = self.dom.lock() else { return };
            st.cntrs.orphan(self.id);
        }
    }
}
