//! Poll sets as in fi_poll(3): progress every member and return the
//! contexts of CQs that are not empty and of counters whose success or
//! error value changed since the last poll. Members count as bindings: a
//! CQ or counter in a poll set cannot be closed (`Busy`), nor can a poll
//! set that still has members.

use crate::domain::{Domain, DomainInner, DomainState};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::Ordering;
use crate::{CompletionQueue, Counter};
use std::sync::{Arc, Mutex};

enum Member {
    Cq { id: usize, ctx: usize },
    Cntr { id: usize, ctx: usize, last: (u64, u64) },
}

impl Member {
    /// Releases the member's binding (freeing an orphaned CQ or counter
    /// with its last one).
    fn unbind(&self, st: &mut DomainState) {
        match *self {
            Member::Cq { id, .. } => st.cqs.unbind(id),
            Member::Cntr { id, .. } => st.cntrs.unbind(id),
        }
    }
}

/// A poll set.
pub struct PollSet {
    dom: Arc<DomainInner>,
    members: Mutex<Vec<Member>>,
}

impl Domain {
    /// fi_poll_open.
    pub fn poll_open(&self) -> Result<PollSet> {
        Ok(PollSet { dom: self.inner.clone(), members: Mutex::new(Vec::new()) })
    }
}

impl PollSet {
    fn members(&self) -> std::sync::MutexGuard<'_, Vec<Member>> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// fi_poll_add for a CQ; `context` is what `poll` returns for it.
    pub fn add_cq(&self, cq: &CompletionQueue, context: usize) -> Result<()> {
        if !Arc::ptr_eq(&cq.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "CQ of another domain"));
        }
        let mut m = self.members();
        if m.iter().any(|x| matches!(x, Member::Cq { id, .. } if *id == cq.id)) {
            return Err(Error::with(ErrorKind::Already, "CQ is already in the poll set"));
        }
        let mut st = self.dom.lock()?;
        st.cqs.bind(cq.id)?;
        m.push(Member::Cq { id: cq.id, ctx: context });
        Ok(())
    }

    /// fi_poll_add for a counter.
    pub fn add_cntr(&self, c: &Counter, context: usize) -> Result<()> {
        if !Arc::ptr_eq(&c.dom, &self.dom) {
            return Err(Error::with(ErrorKind::Inval, "counter of another domain"));
        }
        let mut m = self.members();
        if m.iter().any(|x| matches!(x, Member::Cntr { id, .. } if *id == c.id)) {
            return Err(Error::with(ErrorKind::Already, "counter is already in the poll set"));
        }
        let mut st = self.dom.lock()?;
        st.cntrs.bind(c.id)?;
        let shm = &self.dom.counters()[c.id];
        let last = (shm.value.v.load(Ordering::Acquire), shm.err.v.load(Ordering::Acquire));
        m.push(Member::Cntr { id: c.id, ctx: context, last });
        Ok(())
    }

    /// fi_poll_del for a CQ.
    pub fn del_cq(&self, cq: &CompletionQueue) -> Result<()> {
        let mut m = self.members();
        let i = m
            .iter()
            .position(|x| matches!(x, Member::Cq { id, .. } if *id == cq.id))
            .ok_or_else(|| Error::with(ErrorKind::NoEnt, "CQ is not in the poll set"))?;
        m.remove(i).unbind(&mut *self.dom.lock()?);
        Ok(())
    }

    /// fi_poll_del for a counter.
    pub fn del_cntr(&self, c: &Counter) -> Result<()> {
        let mut m = self.members();
        let i = m
            .iter()
            .position(|x| matches!(x, Member::Cntr { id, .. } if *id == c.id))
            .ok_or_else(|| Error::with(ErrorKind::NoEnt, "counter is not in the poll set"))?;
        m.remove(i).unbind(&mut *self.dom.lock()?);
        Ok(())
    }

    /// fi_poll: one progress pass, then the contexts of members with events
    /// (at most `out.len()`); returns how many were written (0: none).
    pub fn poll(&self, out: &mut [usize]) -> Result<usize> {
        let mut m = self.members();
        let mut st = self.dom.lock()?;
        self.dom.progress(&mut st);
        let mut n = 0;
        for x in m.iter_mut() {
            if n == out.len() {
                break;
            }
            match x {
                Member::Cq { id, ctx } => {
                    if st.cqs.get(*id).is_some_and(|c| !c.entries.is_empty() || !c.errors.is_empty() || c.overrun) {
                        out[n] = *ctx;
                        n += 1;
                    }
                }
                Member::Cntr { id, ctx, last } => {
                    let shm = &self.dom.counters()[*id];
                    let now = (shm.value.v.load(Ordering::Acquire), shm.err.v.load(Ordering::Acquire));
                    if now != *last {
                        *last = now;
                        out[n] = *ctx;
                        n += 1;
                    }
                }
            }
        }
        if n == 0 {
            crate::sync::idle_pause();
        }
        Ok(n)
    }

    /// Whether a member has an event now, without a progress pass and
    /// without taking it (a sleeper's re-check: a CQ filled or a counter
    /// changed by another thread since the last poll). True when the
    /// domain cannot be locked here (the caller then does not sleep).
    fn event_waiting(&self) -> bool {
        let m = self.members();
        let Ok(st) = self.dom.lock() else { return true };
        m.iter().any(|x| match *x {
            Member::Cq { id, .. } => {
                st.cqs.get(id).is_some_and(|c| !c.entries.is_empty() || !c.errors.is_empty() || c.overrun)
            }
            Member::Cntr { id, last, .. } => {
                let shm = &self.dom.counters()[id];
                // SYNC: pairs with the release writes in engine::complete.
                (shm.value.v.load(Ordering::Acquire), shm.err.v.load(Ordering::Acquire)) != last
            }
        })
    }

    /// Closes the poll set; `Busy` while it has members.
    pub fn close(&self) -> Result<()> {
        let m = self.members();
        if !m.is_empty() {
            return Err(Error::with(ErrorKind::Busy, format!("poll set still has {} member(s)", m.len())));
        }
        Ok(())
    }
}

impl Drop for PollSet {
    fn drop(&mut self) {
        // Release the members' bindings.
        let m = std::mem::take(&mut *self.members());
        if let Ok(mut st) = self.dom.lock() {
            for x in m {
                x.unbind(&mut st);
            }
        }
    }
}

/// A CQ that waited through a wait set waits on its own again (the set
/// closed, or let it go).
fn recover(dom: &Arc<DomainInner>, cq: usize) {
    if let Ok(mut st) = dom.lock() {
        if let Some(c) = st.cqs.get_mut(cq) {
            if c.wait_obj == crate::cq::WaitObj::Set {
                c.wait_obj = crate::cq::WaitObj::Unspec;
            }
        }
    }
}

impl Drop for WaitSet {
    fn drop(&mut self) {
        // Its CQs recover (the PollSet's own drop releases the bindings).
        let cqs: Vec<usize> = self
            .set
            .members()
            .iter()
            .filter_map(|x| if let Member::Cq { id, .. } = x { Some(*id) } else { None })
            .collect();
        for id in cqs {
            recover(&self.set.dom, id);
        }
        if let (Some(fd), Some(b)) = (&self.fd, self.set.dom.bridge.lock().unwrap_or_else(|p| p.into_inner()).as_ref())
        {
            b.remove(fd);
        }
    }
}

/// A wait set (fi_wait_open, fi_wait): block until any member CQ is not
/// empty or any member counter changed. A CQ in a wait set waits through it:
/// its own `sread` is refused, as fi_cq(3) says for FI_WAIT_SET. Members
/// are bindings: neither side closes while bound.
pub struct WaitSet {
    set: PollSet,
    /// What `wait` and the application block on (FI_GETWAIT).
    wait_obj: crate::cq::WaitObj,
    /// `Fd`: the eventfd the domain's bridge makes readable (armed by
    /// [`Domain::trywait_with`] with the set) when an event may be there.
    fd: Option<Arc<std::os::fd::OwnedFd>>,
}

impl Domain {
    /// fi_wait_open (on the domain: waiting drives its progress), with the
    /// default wait object (the doorbell).
    pub fn wait_open(&self) -> Result<WaitSet> {
        self.wait_open_with(crate::cq::WaitObj::Unspec)
    }

    /// fi_wait_open with a wait object (fi_wait_attr's wait_obj):
    /// `Unspec` or `Yield` (the doorbell), or `Fd` ([`WaitSet::wait_fd`], for
    /// poll, select or epoll after [`Domain::trywait_with`] with the set).
    /// `None`, `Set`, `MutexCond` and `PollFd` are not offered for wait sets.
    pub fn wait_open_with(&self, wait_obj: crate::cq::WaitObj) -> Result<WaitSet> {
        use crate::cq::WaitObj;
        let fd = match wait_obj {
            WaitObj::Unspec | WaitObj::Yield => None,
            WaitObj::Fd => Some(self.inner.bridged_eventfd()?),
            w => {
                return Err(Error::with(
                    ErrorKind::NoSys,
                    format!("wait sets take Unspec, Yield or Fd as wait object, not {w:?}"),
                ))
            }
        };
        Ok(WaitSet { set: self.poll_open()?, wait_obj, fd })
    }
}

impl WaitSet {
    /// Adds a CQ (its wait object becomes the set).
    pub fn add_cq(&self, cq: &CompletionQueue) -> Result<()> {
        self.set.add_cq(cq, cq.id)?;
        let mut st = self.set.dom.lock()?;
        if let Some(c) = st.cqs.get_mut(cq.id) {
            c.wait_obj = crate::cq::WaitObj::Set;
        }
        Ok(())
    }

    /// Adds a counter.
    pub fn add_cntr(&self, c: &Counter) -> Result<()> {
        self.set.add_cntr(c, usize::MAX - c.id)
    }

    /// Opens a CQ that waits through this set (FI_WAIT_SET names its set
    /// at open): `attr.wait_obj` is taken as [`WaitObj::Set`]. A CQ may
    /// also join later with [`WaitSet::add_cq`].
    ///
    /// [`WaitObj::Set`]: crate::WaitObj::Set
    pub fn cq_open(&self, attr: &crate::CqAttr) -> Result<CompletionQueue> {
        let dom = Domain { inner: self.set.dom.clone() };
        let cq = dom.cq_open(&crate::CqAttr { wait_obj: crate::cq::WaitObj::Unspec, ..*attr })?;
        self.add_cq(&cq)?;
        Ok(cq)
    }

    /// Opens a counter that waits through this set (FI_WAIT_SET names its
    /// set at open).
    pub fn cntr_open(&self) -> Result<Counter> {
        let c = Domain { inner: self.set.dom.clone() }.cntr_open()?;
        self.add_cntr(&c)?;
        Ok(c)
    }

    /// Removes a CQ: it waits on its own again (`Unspec`: its `sread`
    /// works).
    pub fn del_cq(&self, cq: &CompletionQueue) -> Result<()> {
        self.set.del_cq(cq)?;
        recover(&self.set.dom, cq.id);
        Ok(())
    }

    /// Removes a counter.
    pub fn del_cntr(&self, c: &Counter) -> Result<()> {
        self.set.del_cntr(c)
    }

    /// fi_wait: returns when a member has an event (possibly already
    /// there); `-FI_ETIMEDOUT` after `timeout` (`None`: forever;
    /// `Some(Duration::ZERO)`: one try).
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> Result<()> {
        let deadline = crate::domain::deadline(timeout);
        let dom = Domain { inner: self.set.dom.clone() };
        let mut out = [0usize; 1];
        loop {
            if self.set.poll(&mut out)? > 0 {
                return Ok(());
            }
            let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(Error::with(
                    ErrorKind::TimedOut,
                    format!("no event in the wait set within {:?}", timeout.unwrap_or_default()),
                ));
            }
            // The re-check before sleeping: a counter changed by another
            // thread (its add rings the doorbell only if we announced
            // ourselves already) must not be slept through.
            dom.wait_for(left, || self.set.event_waiting());
        }
    }

    /// Whether a member has an event now (one progress pass).
    pub fn has_event(&self) -> Result<bool> {
        let mut out = [0usize; 1];
        Ok(self.set.poll(&mut out)? > 0)
    }

    /// Closes the wait set; `Busy` while it has members.
    pub fn close(&self) -> Result<()> {
        self.set.close().map_err(|_| Error::with(ErrorKind::Busy, "wait set still has members"))
    }

    /// The set's wait object.
    pub fn wait_obj(&self) -> crate::cq::WaitObj {
        self.wait_obj
    }

    /// FI_GETWAIT for an `Fd` wait set: the fd to poll (call
    /// [`Domain::trywait_with`] with the set before blocking on it).
    pub fn wait_fd(&self) -> Result<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.fd.as_ref().map(|f| f.as_raw_fd()).ok_or_else(|| {
            Error::with(ErrorKind::NoSys, format!("wait set's wait object is {:?}, not Fd", self.wait_obj))
        })
    }

    /// Empties the set's fd (trywait, before it looks for events).
    pub(crate) fn drain_fd(&self) {
        if let Some(fd) = &self.fd {
            crate::fdwait::drain(fd);
        }
    }

    /// Whether a member has an event, without a progress pass (trywait's
    /// re-check once the bridge is armed).
    pub(crate) fn event_waiting(&self) -> bool {
        self.set.event_waiting()
    }
}
