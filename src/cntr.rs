//! Counters as in fi_cntr(3): a success value and an error value, both in
//! the domain's shared region (so remote events can update them later);
//! `read` and `readerr` drive progress first. The application's `add`,
//! `set` and their error twins ring the domain's doorbell when someone
//! sleeps on it, so a waiter ([`Counter::wait`], a wait set holding the
//! counter, an armed fd bridge) wakes at once.

use crate::cq::WaitObj;
use crate::domain::{Domain, DomainInner};
use crate::engine::complete::{count, set, Val};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::Ordering;
use std::sync::Arc;

pub(crate) struct CntrState {
    /// (value, error) when trywait last looked.
    pub checkpoint: (u64, u64),
    /// How `wait` waits.
    pub wait_obj: WaitObj,
    /// FI_WAIT_FD: the eventfd the domain's bridge makes readable (armed
    /// by trywait) when a change may have come.
    pub fd: Option<Arc<std::os::fd::OwnedFd>>,
}

/// Attributes of a counter (fi_cntr_attr).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CntrAttr {
    /// Wait object (FI_GETWAIT gives it out): `Unspec` (the default: the
    /// doorbell), `None` (no `wait`), `Yield` (as `Unspec` here), or `Fd`
    /// ([`Counter::wait_fd`], readable after [`Domain::trywait_with`] when
    /// the counter may have changed). `Set` names its set at open
    /// ([`crate::WaitSet::cntr_open`]; here `-FI_EINVAL`). `MutexCond` and
    /// `PollFd` are not offered for counters (`-FI_ENOSYS`).
    pub wait_obj: WaitObj,
}

impl crate::table::Object for CntrState {
    const NAME: &'static str = "counter";
    const BOUND_BY: &'static str = "endpoints or memory registrations, once per direction, or poll or wait sets";
}

/// A counter.
pub struct Counter {
    pub(crate) dom: Arc<DomainInner>,
    pub(crate) id: usize,
    closed: std::sync::atomic::AtomicBool,
}

impl Domain {
    /// Opens a counter (value and error start at 0) with the default
    /// attributes.
    pub fn cntr_open(&self) -> Result<Counter> {
        self.cntr_open_with(&CntrAttr::default())
    }

    /// Opens a counter with `attr` (its wait object).
    pub fn cntr_open_with(&self, attr: &CntrAttr) -> Result<Counter> {
        if attr.wait_obj == WaitObj::Set {
            return Err(Error::with(
                ErrorKind::Inval,
                "FI_WAIT_SET names its wait set: open the counter with WaitSet::cntr_open (or add it with WaitSet::add_cntr)",
            ));
        }
        if matches!(attr.wait_obj, WaitObj::MutexCond | WaitObj::PollFd) {
            return Err(Error::with(
                ErrorKind::NoSys,
                format!("counters take Unspec, None, Yield or Fd as wait object, not {:?}", attr.wait_obj),
            ));
        }
        let fd = if attr.wait_obj == WaitObj::Fd { Some(self.inner.bridged_eventfd()?) } else { None };
        let mut st = self.inner.lock()?;
        let n = self.inner.counters().len();
        // The id indexes the region's counter table.
        if st.cntrs.next_id() >= n {
            return Err(Error::with(ErrorKind::NoSpc, format!("all {n} counters of the domain are open")));
        }
        let id = st.cntrs.insert(CntrState { checkpoint: (0, 0), wait_obj: attr.wait_obj, fd });
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

    /// The counter's index, checked open.
    pub(crate) fn live_id(&self) -> Result<usize> {
        self.shm().map(|_| self.id)
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
        crate::trigger::after_app_change(&self.dom);
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
    /// reaches `threshold`; `-FI_ETIMEDOUT` after `timeout` (`None`:
    /// forever; `Some(Duration::ZERO)`: one try), `-FI_EAVAIL` if the error
    /// value changes meanwhile.
    pub fn wait(&self, threshold: u64, timeout: Option<std::time::Duration>) -> Result<()> {
        if self.wait_obj()? == WaitObj::None {
            return Err(Error::with(ErrorKind::Inval, "the counter's wait object is None: no wait"));
        }
        let deadline = crate::domain::deadline(timeout);
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
                    format!("counter below {threshold} after {:?}", timeout.unwrap_or_default()),
                ));
            }
            // SYNC: pairs with the release writes in engine::complete; the
            // doorbell's fences order these loads against an add's ring.
            dom.wait_for(left, || {
                c.value.v.load(Ordering::Acquire) >= threshold || c.err.v.load(Ordering::Acquire) != err0
            });
        }
    }

    /// The counter's wait object.
    pub fn wait_obj(&self) -> Result<WaitObj> {
        let st = self.dom.lock()?;
        st.cntrs.get(self.id).map(|c| c.wait_obj).ok_or_else(|| Error::with(ErrorKind::Inval, "counter is closed"))
    }

    /// FI_GETWAIT for an `Fd` counter: the fd to poll (call
    /// [`Domain::trywait_with`] with the counter before blocking on it).
    pub fn wait_fd(&self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let st = self.dom.lock()?;
        let c = st.cntrs.get(self.id).ok_or_else(|| Error::with(ErrorKind::Inval, "counter is closed"))?;
        c.fd.as_ref().map(|f| f.as_raw_fd()).ok_or_else(|| {
            Error::with(ErrorKind::NoSys, format!("counter wait object is {:?}, not Fd: no fd to retrieve", c.wait_obj))
        })
    }

    /// Whether [`Counter::close`] closed it (read under the domain lock,
    /// which close holds while it sets this).
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Index of the counter in the domain region's counter table.
    pub fn index(&self) -> usize {
        self.id
    }

    /// Closes the counter; `Busy` while endpoints or memory registrations
    /// ([`crate::MemoryRegion::bind_counter`]) are bound to it.
    pub fn close(&self) -> Result<()> {
        let mut st = self.dom.lock()?;
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let s = match st.cntrs.close(self.id) {
            Err(e) if e.kind() == ErrorKind::Busy => {
                // A registration whose close was Busy holds its binding
                // until its pins are gone: free those that are, and retry.
                drop(st);
                crate::mr::reclaim_quarantine(&self.dom)?;
                st = self.dom.lock()?;
                if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(());
                }
                st.cntrs.close(self.id)?
            }
            r => r?,
        };
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(st);
        if let (Some(fd), Some(b)) = (s.fd, self.dom.bridge.lock().unwrap_or_else(|p| p.into_inner()).as_ref()) {
            b.remove(&fd);
        }
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
