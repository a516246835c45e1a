//! Address vectors: endpoint addresses (24 bytes, from `getname`) in, small
//! integer handles (`FiAddr`) out, as in fi_av(3) with FI_AV_TABLE.

use crate::domain::{Domain, DomainInner};
use crate::error::{Error, ErrorKind, Result};
use crate::flags::FiAddr;
use shm_layout::Address;
use std::collections::HashMap;
use std::sync::Arc;

pub(crate) struct AvState {
    /// Entry i is fi_addr i; None after removal.
    pub entries: Vec<Option<Address>>,
    /// Reverse map, for source addresses of receives.
    pub by_addr: HashMap<Address, FiAddr>,
    /// Bumped at every change (endpoints cache lookups against it).
    pub generation: u64,
}

impl crate::table::Object for AvState {
    const NAME: &'static str = "address vector";
    const BOUND_BY: &'static str = "endpoints";
}

impl AvState {
    pub fn lookup(&self, a: FiAddr) -> Option<Address> {
        self.entries.get(usize::try_from(a).ok()?).copied().flatten()
    }
}

/// An address vector.
pub struct AddressVector {
    pub(crate) dom: Arc<DomainInner>,
    pub(crate) id: usize,
    closed: std::sync::atomic::AtomicBool,
}

impl Domain {
    /// Opens an address vector.
    pub fn av_open(&self) -> Result<AddressVector> {
        let mut st = self.inner.lock()?;
        let id = st.avs.insert(AvState { entries: Vec::new(), by_addr: HashMap::new(), generation: 0 });
        Ok(AddressVector { dom: self.inner.clone(), id, closed: false.into() })
    }
}

impl AddressVector {
    fn with<R>(&self, f: impl FnOnce(&mut AvState) -> Result<R>) -> Result<R> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "address vector is closed"));
        }
        let mut st = self.dom.lock()?;
        let av = st.avs.get_mut(self.id).expect("open AV has state");
        f(av)
    }

    /// Inserts addresses; returns their handles in order. An address already
    /// present gets its existing handle.
    pub fn insert(&self, addrs: &[Address]) -> Result<Vec<FiAddr>> {
        if let Some(a) = addrs.iter().find(|a| !a.is_plausible()) {
            return Err(Error::with(
                ErrorKind::Inval,
                format!("{} is not an endpoint address (no owner pid or token)", Self::straddr(a)),
            ));
        }
        self.with(|av| {
            let mut out = Vec::with_capacity(addrs.len());
            for a in addrs {
                if let Some(&f) = av.by_addr.get(a) {
                    out.push(f);
                    continue;
                }
                let f = match av.entries.iter().position(|e| e.is_none()) {
                    Some(i) => {
                        av.entries[i] = Some(*a);
                        i
                    }
                    None => {
                        av.entries.push(Some(*a));
                        av.entries.len() - 1
                    }
                } as FiAddr;
                av.by_addr.insert(*a, f);
                out.push(f);
            }
            av.generation += 1;
            Ok(out)
        })
    }

    /// Inserts raw address bytes (as `getname` gives them).
    pub fn insert_bytes(&self, raw: &[u8]) -> Result<FiAddr> {
        let a = Address::from_bytes(raw)
            .ok_or_else(|| Error::with(ErrorKind::Inval, format!("address must be {} bytes", Address::SIZE)))?;
        Ok(self.insert(&[a])?[0])
    }

    /// Removes handles; their numbers may be reused by later inserts. The
    /// fi_addr caches of the endpoints bound to this AV are cleared.
    pub fn remove(&self, fi_addrs: &[FiAddr]) -> Result<()> {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::with(ErrorKind::Inval, "address vector is closed"));
        }
        let mut st = self.dom.lock()?;
        let crate::domain::DomainState { avs, eps, .. } = &mut *st;
        let av = avs.get_mut(self.id).expect("open AV has state");
        if let Some(bad) = fi_addrs.iter().find(|f| av.lookup(**f).is_none()) {
            return Err(Error::with(ErrorKind::NoEnt, format!("fi_addr {bad} is not in the address vector")));
        }
        for f in fi_addrs {
            if let Some(a) = av.entries[*f as usize].take() {
                av.by_addr.remove(&a);
            }
        }
        av.generation += 1;
        for ep in eps.iter_mut().filter(|e| e.peers.av() == Some(self.id)) {
            ep.peers.clear_fi_cache();
        }
        Ok(())
    }

    /// The address behind a handle.
    pub fn lookup(&self, fi_addr: FiAddr) -> Result<Address> {
        self.with(|av| {
            av.lookup(fi_addr)
                .ok_or_else(|| Error::with(ErrorKind::NoEnt, format!("fi_addr {fi_addr} is not in the address vector")))
        })
    }

    /// Printable form of an address.
    pub fn straddr(a: &Address) -> String {
        let at = if a.fd == Address::NAMED { "named".to_string() } else { format!("fd{}", a.fd) };
        format!("shmfab://{}:{at}.{:08x}.{:08x}/{}#{}", a.pid, a.job, a.token, a.ep_index, a.generation)
    }

    /// Closes the AV; `Busy` while endpoints are bound to it.
    pub fn close(&self) -> Result<()> {
        let mut st = self.dom.lock()?;
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        st.avs.close(self.id)?;
        self.closed.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for AddressVector {
    fn drop(&mut self) {
        if self.close().is_err() {
            let Ok(mut st) = self.dom.lock() else { return };
            st.avs.orphan(self.id);
        }
    }
}
