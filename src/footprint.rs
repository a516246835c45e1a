//! Memory a rank needs for N ranks on a node, by how it receives.
//!
//! An endpoint's section (rings, overflow queue, bounce-buffer pool) has a
//! fixed size whatever the number of peers: its 16 ring slots go to the
//! first senders, later ones share the overflow queue, and the pool serves
//! every inbound peer. So with one endpoint per rank the shared memory per
//! rank is constant and a node needs O(N). What grows with N is the
//! in-process state per peer (a few hundred bytes) and, with receive queues
//! per peer (one endpoint per connection, as verbs RC or DAT), the posted
//! buffers: (N - 1) x depth each; a shared receive queue keeps them at one
//! depth for all.

use crate::proto::Config;

/// How a rank receives, for [`per_rank`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvModel {
    /// One endpoint per rank; its untagged receives from one SRQ of
    /// `depth` buffers (or the endpoint's own queue: the same memory).
    SharedQueue {
        /// Buffers posted.
        depth: usize,
    },
    /// One endpoint per peer (connection style), each with its own queue of
    /// `depth` buffers.
    PerPeerQueues {
        /// Buffers posted per peer.
        depth: usize,
    },
    /// One endpoint per peer, all bound to one SRQ of `depth` buffers.
    PerPeerEndpointsSrq {
        /// Buffers posted in the SRQ.
        depth: usize,
    },
}

/// A rank's memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Its shared region: header, counters and endpoint sections.
    pub shared: usize,
    /// In-process state for its peers.
    pub peers: usize,
    /// Receive buffers posted.
    pub buffers: usize,
}

impl Footprint {
    /// Everything.
    pub fn total(&self) -> usize {
        self.shared + self.peers + self.buffers
    }
}

/// In-process bytes per peer of an endpoint: its `Peer` record, its address
/// map and fi_addr cache entries, and its AV entry.
pub fn peer_bytes() -> usize {
    let addr = std::mem::size_of::<shm_layout::Address>();
    std::mem::size_of::<crate::engine::peers::Peer>()
        + (addr + 2 * std::mem::size_of::<usize>()) // peer_by_addr entry
        + std::mem::size_of::<u32>() // peer_by_fi
        + 2 * (addr + std::mem::size_of::<u64>()) // AV entry and its reverse map
}

/// Memory of one rank among `n` on a node receiving by `model` into
/// buffers of `buf` bytes, with the configuration's geometry.
pub fn per_rank(cfg: &Config, n: usize, model: RecvModel, buf: usize) -> Footprint {
    let g = &cfg.geometry;
    let peers = n.saturating_sub(1);
    let base = shm_layout::eps_offset(cfg.max_counters);
    let section = g.section_size();
    let (eps, bufs) = match model {
        RecvModel::SharedQueue { depth } => (1, depth),
        RecvModel::PerPeerQueues { depth } => (peers.max(1), peers * depth),
        RecvModel::PerPeerEndpointsSrq { depth } => (peers.max(1), depth),
    };
    Footprint { shared: base + eps * section, peers: eps * peers * peer_bytes(), buffers: bufs * buf }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_endpoint_per_rank_is_flat_in_shared_memory() {
        let cfg = Config::default();
        let m = RecvModel::SharedQueue { depth: 128 };
        let (a, b) = (per_rank(&cfg, 2, m, 4096), per_rank(&cfg, 256, m, 4096));
        assert_eq!(a.shared, b.shared);
        assert_eq!(a.buffers, b.buffers);
        assert_eq!(b.peers, 255 * peer_bytes());
        // Per-peer queues grow with N per rank (N squared per node).
        let p = per_rank(&cfg, 256, RecvModel::PerPeerQueues { depth: 64 }, 4096);
        assert_eq!(p.buffers, 255 * 64 * 4096);
        assert_eq!(p.shared, shm_layout::eps_offset(cfg.max_counters) + 255 * cfg.geometry.section_size());
    }
}
