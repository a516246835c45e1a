//! Protocols by size, chosen in one place ([`choose`]), and the tunables
//! that steer them (read once from the environment by [`Config::from_env`]).
//!
//! | protocol | when | data moves |
//! | --- | --- | --- |
//! | [`Proto::Inline`] | below `cma_min` where single copy is usable, else up to `inline_max`; on the overflow queue up to one cell (72 B) | in the ring cells, one copy each side |
//! | [`Proto::Bounce`] | single copy not usable: up to `rndv_min` (and on the overflow queue, or with more iovs than its RTS holds) | eagerly through chunks of the receiver's pool, pipelined: the sender fills chunk k+1 while the receiver drains chunk k |
//! | [`Proto::Rndv`] | from `cma_min` where single copy is usable, else from `rndv_min` | request to send first; when a receive matches, one copy: the receiver reads the sender's buffer with process_vm_readv (from `split_min`, both sides copy half each). Where CMA is off or the kernel refuses it (EPERM, ENOSYS; both sides then stop offering it to that peer) the receiver asks for the data through the pool |
//!
//! "Single copy usable" means: CMA not off, not refused by that peer, and the
//! payload not a provider-held copy (an inject queued behind other sends).
//! The defaults are the crossovers measured on the 2-vCPU development VMs
//! (ping-pong, separate send and receive buffers): single copy beats the
//! ring from about 6 KiB; without it the ring beats the pool up to 16 KiB.
//!
//! Headers leave in send order (so matching follows send order); the data
//! of several messages to one peer may be in flight at once, and
//! completions are still written in send order per peer. An unexpected
//! rendezvous costs the receiver one small entry; an unexpected bounce
//! message is copied out of the pool (counted against `SHMFAB_UNEXP_MAX`),
//! so pool chunks are always given back promptly.
//!
//! Environment variables (all optional):
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `SHMFAB_INLINE_MAX` | largest message sent inline in a ring when single copy is not usable | 16384 |
//! | `SHMFAB_CMA_MIN` | smallest message sent by rendezvous with single copy, when usable | 6144 |
//! | `SHMFAB_RNDV_MIN` | smallest message sent by rendezvous when single copy is not usable (data through the pool on demand) | 131072 |
//! | `SHMFAB_CMA` | `auto`, `off` (never offer CMA), `fail` (act as if the kernel refused it: tests the fallback), `nowrite` (refuse only the sender's writes of a split copy: tests that fallback) | `auto` |
//! | `SHMFAB_SPLIT_MIN` | smallest single-copy message whose copy both sides share (receiver reads the first half, sender writes the second with process_vm_writev), once single copy has worked with that peer | 524288 |
//! | `SHMFAB_RING_SLOTS` | SPSC rings per endpoint (more senders use the overflow queue) | 16 |
//! | `SHMFAB_RING_CELLS` | 64-byte cells per ring | 1024 |
//! | `SHMFAB_OVF_CELLS` | entries of the overflow queue | 256 |
//! | `SHMFAB_POOL_CHUNKS`, `SHMFAB_CHUNK_SIZE` | bounce pool | 32, 65536 |
//! | `SHMFAB_UNEXP_MAX` | bytes of unexpected inline messages an endpoint holds before it stops draining (back-pressure) | 8 MiB |
//! | `SHMFAB_TX_SIZE`, `SHMFAB_RX_SIZE` | outstanding sends / posted receives per endpoint | 4096 |
//! | `SHMFAB_PEER_CHECK_MS` | how often a peer with pending operations is checked for life; a dead peer's operations fail within about this time | 100 |

pub use crate::engine::request::OpKind;
use crate::ring::payload_capacity;
use shm_layout::{EpGeometry, OVF_PAYLOAD};

/// How a message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    /// Payload inline in ring (or overflow) cells.
    Inline,
    /// Pipelined through the receiver's pool chunks.
    Bounce,
    /// Rendezvous: a request to send; on match the receiver reads the data
    /// by single copy (process_vm_readv) if offered and allowed, else asks
    /// for it through the pool.
    Rndv,
}

/// CMA policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmaMode {
    /// Use it where the kernel allows.
    Auto,
    /// Never offer it.
    Off,
    /// Offer it but act as if the kernel refused (tests the fallback).
    Fail,
    /// Reads work, writes are refused (tests the split copy's fallback).
    NoWrite,
}

/// Tunables in force for a domain.
#[derive(Clone, Debug)]
pub struct Config {
    /// Largest inline message (ring path) when single copy is not usable.
    pub inline_max: usize,
    /// Smallest rendezvous (single copy) message when single copy is usable.
    pub cma_min: usize,
    /// Smallest rendezvous message when single copy is not usable.
    pub rndv_min: usize,
    /// CMA policy.
    pub cma: CmaMode,
    /// Smallest single-copy message split between both sides (the
    /// receiver reads the first half while the sender writes the second).
    pub split_min: usize,
    /// Geometry of each endpoint section.
    pub geometry: EpGeometry,
    /// Endpoint sections per domain region (`SHMFAB_MAX_EPS`, 1 to 256,
    /// default 64: enough for an endpoint per peer up to 63 peers). A
    /// section's memory is reserved only when an endpoint opens on it, so
    /// unused sections cost address space, not memory.
    pub max_eps: u32,
    /// Counters per domain region.
    pub max_counters: u32,
    /// Unexpected inline bytes held per endpoint.
    pub unexp_max: usize,
    /// Outstanding transmit operations per endpoint.
    pub tx_size: usize,
    /// Posted receives per endpoint.
    pub rx_size: usize,
    /// How often a peer with pending operations is checked for life.
    pub peer_check: std::time::Duration,
}

/// Largest payload an inject accepts (buffer reusable on return).
pub const INJECT_SIZE: usize = 4096;
/// Largest message.
pub const MAX_MSG_SIZE: usize = 1 << 40;

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| {
            let v = v.trim();
            let (num, mul) = match v.as_bytes().last() {
                Some(b'k' | b'K') => (&v[..v.len() - 1], 1024),
                Some(b'm' | b'M') => (&v[..v.len() - 1], 1024 * 1024),
                Some(b'g' | b'G') => (&v[..v.len() - 1], 1024 * 1024 * 1024),
                _ => (v, 1),
            };
            num.parse::<usize>().ok().map(|n| n * mul)
        })
        .unwrap_or(default)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            inline_max: 16384,
            cma_min: 6144,
            rndv_min: 128 * 1024,
            cma: CmaMode::Auto,
            split_min: 512 * 1024,
            geometry: EpGeometry {
                n_slots: 16,
                ring_cells: 1024,
                ovf_cells: 256,
                pool_chunks: 32,
                chunk_size: 64 * 1024,
                reserved: 0,
            },
            max_eps: 64,
            max_counters: 64,
            unexp_max: 8 << 20,
            tx_size: 4096,
            rx_size: 4096,
            peer_check: std::time::Duration::from_millis(100),
        }
    }
}

impl Config {
    /// Defaults overridden by the `SHMFAB_*` environment variables, then
    /// clamped to what the geometry allows.
    pub fn from_env() -> Config {
        let d = Config::default();
        let g = EpGeometry {
            n_slots: env_num("SHMFAB_RING_SLOTS", d.geometry.n_slots as usize) as u32,
            ring_cells: env_num("SHMFAB_RING_CELLS", d.geometry.ring_cells as usize) as u32,
            ovf_cells: env_num("SHMFAB_OVF_CELLS", d.geometry.ovf_cells as usize) as u32,
            pool_chunks: env_num("SHMFAB_POOL_CHUNKS", d.geometry.pool_chunks as usize) as u32,
            chunk_size: env_num("SHMFAB_CHUNK_SIZE", d.geometry.chunk_size as usize) as u32,
            reserved: 0,
        };
        let cma = match std::env::var("SHMFAB_CMA").as_deref() {
            Ok("off") | Ok("0") => CmaMode::Off,
            Ok("fail") => CmaMode::Fail,
            Ok("nowrite") => CmaMode::NoWrite,
            _ => CmaMode::Auto,
        };
        let mut c = Config {
            inline_max: env_num("SHMFAB_INLINE_MAX", d.inline_max),
            cma_min: env_num("SHMFAB_CMA_MIN", d.cma_min),
            rndv_min: env_num("SHMFAB_RNDV_MIN", d.rndv_min),
            cma,
            split_min: env_num("SHMFAB_SPLIT_MIN", d.split_min),
            geometry: if g.validate().is_ok() { g } else { d.geometry },
            max_eps: env_num("SHMFAB_MAX_EPS", d.max_eps as usize).clamp(1, 256) as u32,
            max_counters: d.max_counters,
            unexp_max: env_num("SHMFAB_UNEXP_MAX", d.unexp_max),
            tx_size: env_num("SHMFAB_TX_SIZE", d.tx_size).max(1),
            rx_size: env_num("SHMFAB_RX_SIZE", d.rx_size).max(1),
            peer_check: std::time::Duration::from_millis(env_num("SHMFAB_PEER_CHECK_MS", 100).clamp(1, 60_000) as u64),
        };
        c.clamp();
        c
    }

    /// Keeps the thresholds inside what the geometry can carry: an inline
    /// message may use at most a quarter of a ring.
    pub fn clamp(&mut self) {
        let ring_max = payload_capacity(self.geometry.ring_cells as usize / 4);
        self.inline_max = self.inline_max.min(ring_max);
        self.cma_min = self.cma_min.clamp(1, ring_max + 1);
        self.rndv_min = self.rndv_min.max(self.inline_max + 1);
    }
}

/// What travels how: the one place that decides, by operation kind and
/// size. Messages (untagged and tagged) take the protocols below; the
/// other kinds are not carried yet (submission refuses them first) and
/// would go by rendezvous.
///
/// `on_ring`: the sender has an SPSC ring to this peer (else it uses the
/// overflow queue, whose cells carry at most [`OVF_PAYLOAD`] bytes and an RTS
/// with at most 3 iovs). `cma_ok`: single copy is usable ([`offer_cma`]).
pub fn choose(cfg: &Config, kind: OpKind, len: usize, niov: usize, on_ring: bool, cma_ok: bool) -> Proto {
    if !matches!(kind, OpKind::Msg | OpKind::Tagged) {
        return Proto::Rndv;
    }
    let (inline_max, rndv_min) = match (on_ring, cma_ok) {
        (true, true) => (cfg.cma_min - 1, cfg.cma_min),
        (true, false) => (cfg.inline_max, cfg.rndv_min),
        (false, true) => (OVF_PAYLOAD, cfg.cma_min.max(OVF_PAYLOAD + 1)),
        (false, false) => (OVF_PAYLOAD, cfg.rndv_min),
    };
    if len <= inline_max {
        Proto::Inline
    } else if len >= rndv_min && (on_ring || niov <= 3) {
        Proto::Rndv
    } else {
        Proto::Bounce
    }
}

/// Whether [`choose`] picks [`Proto::Inline`] for a one-segment message of
/// `len` bytes on a ring whether or not single copy is offered: the send
/// fast path's check, without the single-copy question.
#[inline(always)]
pub fn inline_on_ring(cfg: &Config, len: usize) -> bool {
    len < cfg.cma_min && len <= cfg.inline_max
}

/// Whether a rendezvous offers single copy: CMA not off, not known refused
/// by this peer, and the payload not a provider-owned copy (inject).
pub fn offer_cma(cfg: &Config, peer_refused: bool, owned: bool) -> bool {
    cfg.cma != CmaMode::Off && !peer_refused && !owned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_pick_each_protocol() {
        let c = Config::default();
        // Single copy usable.
        assert_eq!(choose(&c, OpKind::Msg, 0, 1, true, true), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, c.cma_min - 1, 1, true, true), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, c.cma_min, 1, true, true), Proto::Rndv);
        // Not usable: ring, then eager pool, then rendezvous through the pool.
        assert_eq!(choose(&c, OpKind::Msg, c.inline_max, 1, true, false), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, c.inline_max + 1, 1, true, false), Proto::Bounce);
        assert_eq!(choose(&c, OpKind::Msg, c.rndv_min - 1, 1, true, false), Proto::Bounce);
        assert_eq!(choose(&c, OpKind::Msg, c.rndv_min, 1, true, false), Proto::Rndv);
        // Overflow queue: one cell inline, RTS holds 3 iovs.
        assert_eq!(choose(&c, OpKind::Msg, OVF_PAYLOAD, 1, false, true), Proto::Inline);
        assert_eq!(choose(&c, OpKind::Msg, OVF_PAYLOAD + 1, 1, false, false), Proto::Bounce);
        assert_eq!(choose(&c, OpKind::Msg, c.cma_min.max(OVF_PAYLOAD + 1), 3, false, true), Proto::Rndv);
        assert_eq!(choose(&c, OpKind::Msg, c.rndv_min, 4, false, false), Proto::Bounce);
        assert!(offer_cma(&c, false, false));
        // The fast check agrees with choose() wherever it answers yes.
        for len in [0, 8, c.inline_max.min(c.cma_min - 1), c.inline_max, c.cma_min - 1, c.cma_min, c.inline_max + 1] {
            if inline_on_ring(&c, len) {
                assert_eq!(choose(&c, OpKind::Msg, len, 1, true, true), Proto::Inline, "len {len}");
                assert_eq!(choose(&c, OpKind::Msg, len, 1, true, false), Proto::Inline, "len {len}");
            }
        }
        assert!(inline_on_ring(&c, 8));
        assert!(!offer_cma(&c, true, false), "refused peer");
        assert!(!offer_cma(&c, false, true), "inject copy");
        let off = Config { cma: CmaMode::Off, ..Config::default() };
        assert!(!offer_cma(&off, false, false));
    }

    #[test]
    fn clamp_keeps_inline_within_a_quarter_ring() {
        let mut c = Config { inline_max: 1 << 30, cma_min: 1 << 30, ..Config::default() };
        c.clamp();
        assert!(crate::ring::cells_for(c.inline_max) <= c.geometry.ring_cells as usize / 4);
        assert!(crate::ring::cells_for(c.cma_min - 1) <= c.geometry.ring_cells as usize / 4);
        assert!(c.rndv_min > c.inline_max);
    }
}
