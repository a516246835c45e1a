//! Operation and completion flags, with libfabric's values (`rdma/fabric.h`).

/// An address handle returned by an address vector.
pub type FiAddr = u64;
/// Any source (directed receive off).
pub const FI_ADDR_UNSPEC: FiAddr = u64::MAX;
/// Source address not available (not in the AV).
pub const FI_ADDR_NOTAVAIL: FiAddr = u64::MAX;

/// Message operation.
pub const FI_MSG: u64 = 1 << 1;
/// RMA operation.
pub const FI_RMA: u64 = 1 << 2;
/// Tagged operation.
pub const FI_TAGGED: u64 = 1 << 3;
/// Atomic operation.
pub const FI_ATOMIC: u64 = 1 << 4;
/// Local read.
pub const FI_READ: u64 = 1 << 8;
/// Local write.
pub const FI_WRITE: u64 = 1 << 9;
/// Receive.
pub const FI_RECV: u64 = 1 << 10;
/// Send.
pub const FI_SEND: u64 = 1 << 11;
/// Transmit (bind flag).
pub const FI_TRANSMIT: u64 = FI_SEND;
/// Remote read.
pub const FI_REMOTE_READ: u64 = 1 << 12;
/// Remote write.
pub const FI_REMOTE_WRITE: u64 = 1 << 13;
/// Multi-receive buffer.
pub const FI_MULTI_RECV: u64 = 1 << 16;
/// Receive flag (tagged): look for a matching unexpected message without
/// taking it; the result is a completion (see [`crate::Endpoint::trecvmsg`]).
pub const FI_PEEK: u64 = 1 << 19;
/// Receive flag (tagged): with FI_PEEK, reserve the message found for a
/// later FI_CLAIM receive with the same context; alone, that receive.
pub const FI_CLAIM: u64 = 1 << 59;
/// Receive flag (tagged): with FI_PEEK or FI_CLAIM, drop the message.
pub const FI_DISCARD: u64 = 1 << 58;
/// Remote CQ data present.
pub const FI_REMOTE_CQ_DATA: u64 = 1 << 17;
/// Generate a completion (selective completion).
pub const FI_COMPLETION: u64 = 1 << 24;
/// Inject: buffer reusable on return.
pub const FI_INJECT: u64 = 1 << 25;
/// Fence: this operation starts after every earlier one completed (all
/// of shmfab's one-sided operations complete before their call returns).
pub const FI_FENCE: u64 = 1 << 21;
/// Completion once the buffer may be reused.
pub const FI_INJECT_COMPLETE: u64 = 1 << 26;
/// Completion once the operation left the initiator.
pub const FI_TRANSMIT_COMPLETE: u64 = 1 << 27;
/// Completion once the data is in the target's memory.
pub const FI_DELIVERY_COMPLETE: u64 = 1 << 28;
/// Remote-event counters (capability): operations landing in registered
/// memory count on the counters bound to it.
pub const FI_RMA_EVENT: u64 = 1 << 56;
/// Bind flag: only operations with FI_COMPLETION generate entries.
pub const FI_SELECTIVE_COMPLETION: u64 = 1 << 59;
/// shmfab's own operation flag: the message is solicited (completion
/// notification armed for solicited completions fires on its receive), as
/// ibverbs' IBV_SEND_SOLICITED. libfabric has no such flag; the bit is in
/// the range libfabric leaves to providers.
pub const SHMFAB_SOLICITED: u64 = 1 << 62;
