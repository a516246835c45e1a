//! The engine of an endpoint, in owned parts. Each part keeps its state
//! private and its invariants on its own fields; the endpoint
//! ([`EpState`]) is their composition, and the operations that need
//! several parts at once (a send: peers, transmit, completion; a receive:
//! inbound, matching, completion) are methods of it, written in the
//! module of the part they mostly drive.
//!
//! | part | module | owns |
//! | --- | --- | --- |
//! | peers | [`peers`] | the peer table, the fi_addr cache, first contact, liveness |
//! | matching | [`matching`] | posted and unexpected queues, their budget, multi-receive, the tag predicate |
//! | transmit | [`tx`] | per-peer send, in-flight and control queues, busy peers, the outstanding count |
//! | completion | [`complete`] | CQ and counter bindings, the counter writer, receives in progress and their order |
//! | inbound | [`inbound`] | claimed rings, the overflow queue, our pool |
//! | requests | [`request`] | operations as values, one submit path |
//!
//! The progress pass that drives them is [`crate::progress`]; the
//! endpoint API is [`crate::ep`].

pub(crate) mod complete;
pub(crate) mod inbound;
pub(crate) mod matching;
pub(crate) mod peers;
pub(crate) mod request;
pub(crate) mod tx;

use crate::domain::Section;
use crate::ep::EpStats;
use shm_layout::Address;

/// In-process state of an endpoint: its parts (see the module docs).
pub(crate) struct EpState {
    /// Our address (section index and generation included).
    pub addr: Address,
    /// Enabled: binds are over, operations are accepted. Set only by
    /// [`EpState::set_enabled`] (which keeps `polled`).
    pub enabled: bool,
    /// Passive: the domain's progress passes and doorbell sleeps leave
    /// this endpoint alone (its messages wait in its rings) until it is
    /// made active again; for the World's barrier endpoint, which costs
    /// nothing outside a barrier so.
    passive: bool,
    /// `enabled && !passive`, kept by [`EpState::set_enabled`] and
    /// [`EpState::set_passive`]: one load for each pass's test
    /// ([`EpState::polled`]).
    polled: bool,
    /// Our section of the domain's region.
    pub sec: Section,
    pub peers: peers::Peers,
    pub matching: matching::Matching,
    pub tx: tx::TxEngine,
    pub bind: complete::Bindings,
    pub inbound: inbound::Inbound,
    pub stats: EpStats,
    /// Progress passes made up to the last housekeeping (a gauge; the
    /// passes since are `hk_from - hk_left`).
    pub passes: u32,
    /// Passes left until the next housekeeping (which looks at the clock):
    /// counted down by each pass, one compare on its path; 1 after a
    /// doorbell sleep ([`EpState::check_soon`]).
    pub hk_left: u32,
    /// What `hk_left` was last set to.
    pub hk_from: u32,
    /// When peers with pending operations were last checked for life.
    pub last_check: std::time::Instant,
}

/// Progress passes between two housekeepings of an endpoint.
pub const HK_PERIOD: u32 = 256;

impl EpState {
    /// A new, unbound endpoint on section `sec` (opened at `addr`).
    /// Inline messages from `pipe_min` bytes go piped (`Config::pipe_min`);
    /// answers from ring cell `ring_lap` on take the rest of the lap
    /// (`Config::ring_lap`).
    pub fn new(addr: Address, sec: Section, pipe_min: usize, ring_lap: usize) -> EpState {
        EpState {
            addr,
            enabled: false,
            passive: false,
            polled: false,
            inbound: inbound::Inbound::new(&sec),
            sec,
            peers: peers::Peers::new(pipe_min, ring_lap),
            matching: matching::Matching::new(),
            tx: tx::TxEngine::new(),
            bind: complete::Bindings::new(),
            stats: EpStats::default(),
            passes: 0,
            hk_left: HK_PERIOD,
            hk_from: HK_PERIOD,
            last_check: std::time::Instant::now(),
        }
    }

    /// The next progress pass does the housekeeping (looks at the clock,
    /// and checks peers for life when a period has passed): after a sleep.
    pub fn check_soon(&mut self) {
        let done = self.hk_from - self.hk_left;
        self.hk_from = done + 1;
        self.hk_left = 1;
    }

    /// Whether the domain's progress passes drive this endpoint.
    #[inline(always)]
    pub fn polled(&self) -> bool {
        self.polled
    }

    /// Enables the endpoint (see `Endpoint::enable`).
    pub fn set_enabled(&mut self) {
        self.enabled = true;
        self.polled = !self.passive;
    }

    /// Makes the endpoint passive or active (see [`EpState::passive`]).
    pub fn set_passive(&mut self, passive: bool) {
        self.passive = passive;
        self.polled = self.enabled && !passive;
    }

    /// Whether a message that a pass may take is waiting in any inbound
    /// ring or the overflow queue (not those held back: see
    /// [`inbound::Inbound::ready`]).
    pub fn inbound_ready(&self) -> bool {
        self.inbound.ready(&self.sec)
    }

    /// Whether the endpoint has work that no doorbell will announce (sends
    /// waiting for room, an overflow claim that may be dead, messages held
    /// back until the application posts receives or reads its CQ, which
    /// may happen in another thread and rings nothing).
    pub fn local_work(&self) -> bool {
        self.tx.any_busy() || self.inbound.ovf_stuck.is_some() || self.polled() && self.inbound.holds_back()
    }

    /// Whether we have anything pending with peer `p`.
    pub fn pending_with(&self, p: usize) -> bool {
        let peer = &self.peers[p];
        peer.tx.pending() || peer.rx.feeding() || self.matching.directed_at(p)
    }

    /// Whether we wait on peer `p` itself (a matched receive whose data it
    /// is sending, or a send of ours awaiting its FIN or CTS): then its
    /// messages are always drained, since what we wait for may be behind.
    pub fn waiting_on(&self, p: usize) -> bool {
        let peer = &self.peers[p];
        peer.rx.feeding() || peer.tx.awaiting_answer()
    }
}
