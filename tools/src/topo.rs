//! The node's topology from hwloc 2.x (through the maintained `hwlocality`
//! binding): what `shmfab info` shows, and the CPU sets `shmfab run --bind`
//! pins ranks to (computed here, applied with sched_setaffinity between fork
//! and exec, before the rank touches its region: the pages land on its NUMA
//! node).

use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::Topology;
use shmfab::{Error, ErrorKind, Result};

/// What hwloc says about this node.
#[derive(Clone, Debug, Default)]
pub struct Topo {
    /// Processor packages (sockets).
    pub packages: usize,
    /// NUMA nodes: (OS index, CPUs, memory bytes).
    pub numa: Vec<(usize, Vec<usize>, u64)>,
    /// Cores, each with the OS indexes of its hardware threads.
    pub cores: Vec<Vec<usize>>,
    /// Caches by level: (name, count, bytes each).
    pub caches: Vec<(&'static str, usize, u64)>,
}

fn cpus_of(o: &TopologyObject) -> Vec<usize> {
    o.cpuset().map(|s| s.iter_set().map(usize::from).collect()).unwrap_or_default()
}

/// Discovers the topology.
pub fn discover() -> Result<Topo> {
    let t = Topology::new().map_err(|e| Error::with(ErrorKind::Other, format!("hwloc: {e}")))?;
    let packages = t.objects_with_type(ObjectType::Package).count();
    let numa = t
        .objects_with_type(ObjectType::NUMANode)
        .map(|o| {
            let mem = match o.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
                _ => 0,
            };
            (o.os_index().unwrap_or(0), cpus_of(o), mem)
        })
        .collect();
    let cores = t.objects_with_type(ObjectType::Core).map(cpus_of).collect();
    let mut caches = Vec::new();
    for (ty, name) in [(ObjectType::L1Cache, "L1d"), (ObjectType::L2Cache, "L2"), (ObjectType::L3Cache, "L3")] {
        let objs: Vec<&TopologyObject> = t.objects_with_type(ty).collect();
        if let Some(o) = objs.first() {
            let size = match o.attributes() {
                Some(ObjectAttributes::Cache(c)) => c.size().map_or(0, |s| s.get()),
                _ => 0,
            };
            caches.push((name, objs.len(), size));
        }
    }
    Ok(Topo { packages, numa, cores, caches })
}

impl Topo {
    /// CPU sets to bind ranks to, one per binding unit, for `--bind core`
    /// (one set per core) or `--bind numa` (one per NUMA node with CPUs).
    pub fn units(&self, numa: bool) -> Vec<Vec<usize>> {
        let v: Vec<Vec<usize>> = if numa {
            self.numa.iter().map(|n| n.1.clone()).filter(|c| !c.is_empty()).collect()
        } else {
            self.cores.iter().filter(|c| !c.is_empty()).cloned().collect()
        };
        v
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hwloc_sees_this_node() {
        let t = super::discover().expect("hwloc topology");
        assert!(t.packages >= 1, "{t:?}");
        assert!(!t.cores.is_empty() && t.cores.iter().all(|c| !c.is_empty()), "{t:?}");
        assert!(!t.numa.is_empty(), "{t:?}");
        let ncpu = crate::bench::ncpus();
        let in_cores: usize = t.cores.iter().map(|c| c.len()).sum();
        assert_eq!(in_cores, ncpu, "every online CPU is in one core: {t:?}");
        assert!(!t.units(false).is_empty() && !t.units(true).is_empty());
    }
}
