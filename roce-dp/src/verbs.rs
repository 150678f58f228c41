//! Work requests, completions and completion queues: the verbs-level data the engine exchanges with applications.

use std::collections::VecDeque;

/// A scatter/gather element: `len` bytes at `addr` in the region of `lkey`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address inside the region.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// Send-queue work request opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WrOpcode {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm,
    /// SEND that invalidates an rkey at the responder.
    SendWithInv,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA WRITE with immediate data (consumes a receive WQE at the responder).
    RdmaWriteWithImm,
    /// RDMA READ.
    RdmaRead,
    /// 64-bit compare and swap.
    AtomicCmpSwp,
    /// 64-bit fetch and add.
    AtomicFetchAdd,
}

impl WrOpcode {
    /// Every opcode, in declaration order (for tests and tools that pick or sweep opcodes).
    pub const ALL: [WrOpcode; 8] = [
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::SendWithInv,
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead,
        WrOpcode::AtomicCmpSwp,
        WrOpcode::AtomicFetchAdd,
    ];
    /// READ or atomic: needs a responder resource and counts against max_rd_atomic.
    #[inline]
    pub const fn is_rd_atomic(self) -> bool {
        matches!(self, WrOpcode::RdmaRead | WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd)
    }
    /// Atomic.
    #[inline]
    pub const fn is_atomic(self) -> bool {
        matches!(self, WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd)
    }
    /// The completion opcode reported for this WR.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv => WcOpcode::Send,
            WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            WrOpcode::RdmaRead => WcOpcode::RdmaRead,
            WrOpcode::AtomicCmpSwp => WcOpcode::CompSwap,
            WrOpcode::AtomicFetchAdd => WcOpcode::FetchAdd,
        }
    }
}

/// A send work request. The scatter/gather list is passed separately to `post_send`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub opcode: WrOpcode,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Wait for every earlier READ and atomic to complete before starting.
    pub fence: bool,
    /// Set the solicited-event bit on the last packet.
    pub solicited: bool,
    /// Copy the payload at post time (SEND/WRITE only, up to the QP's max_inline).
    pub inline: bool,
    /// Immediate data (…_WITH_IMM), opaque.
    pub imm: u32,
    /// rkey to invalidate (SEND_WITH_INV).
    pub invalidate_rkey: u32,
    /// Remote address (WRITE, READ, atomics).
    pub remote_addr: u64,
    /// Remote key (WRITE, READ, atomics).
    pub rkey: u32,
    /// Compare value (CMP_SWP) or add value (FETCH_ADD).
    pub compare_add: u64,
    /// Swap value (CMP_SWP).
    pub swap: u64,
}

impl SendWr {
    /// A signaled request of `opcode` with everything else zero.
    pub const fn new(wr_id: u64, opcode: WrOpcode) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            signaled: true,
            fence: false,
            solicited: false,
            inline: false,
            imm: 0,
            invalidate_rkey: 0,
            remote_addr: 0,
            rkey: 0,
            compare_add: 0,
            swap: 0,
        }
    }
    /// Sets the remote address and key.
    pub const fn remote(mut self, addr: u64, rkey: u32) -> SendWr {
        self.remote_addr = addr;
        self.rkey = rkey;
        self
    }
}

/// Completion status codes (the IB `ibv_wc_status` values that this engine produces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Success.
    Success,
    /// Local length error (message longer than the receive buffer, or over 2^31).
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local protection error (bad lkey, range or rights in an SGE).
    LocProtErr,
    /// Flushed: the QP was in the error state.
    WrFlushErr,
    /// Memory-window bind error (not produced yet).
    MwBindErr,
    /// Bad response from the responder (unexpected opcode or length).
    BadRespErr,
    /// Local access error.
    LocAccessErr,
    /// The responder NAKed with invalid request.
    RemInvReqErr,
    /// The responder NAKed with remote access error.
    RemAccessErr,
    /// The responder NAKed with remote operational error.
    RemOpErr,
    /// Transport retry counter exhausted (timeouts / sequence-error NAKs).
    RetryExcErr,
    /// RNR retry counter exhausted.
    RnrRetryExcErr,
    /// Fatal error.
    FatalErr,
}

impl WcStatus {
    /// The `ibv_wc_status` number.
    pub const fn code(self) -> u32 {
        match self {
            WcStatus::Success => 0,
            WcStatus::LocLenErr => 1,
            WcStatus::LocQpOpErr => 2,
            WcStatus::LocProtErr => 4,
            WcStatus::WrFlushErr => 5,
            WcStatus::MwBindErr => 6,
            WcStatus::BadRespErr => 7,
            WcStatus::LocAccessErr => 8,
            WcStatus::RemInvReqErr => 9,
            WcStatus::RemAccessErr => 10,
            WcStatus::RemOpErr => 11,
            WcStatus::RetryExcErr => 12,
            WcStatus::RnrRetryExcErr => 13,
            WcStatus::FatalErr => 19,
        }
    }
    /// The ibverbs name, as `ibv_wc_status_str` prints it.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::FatalErr => "fatal error",
        }
    }
}

/// Completion opcodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// SEND (send queue).
    Send,
    /// RDMA WRITE (send queue).
    RdmaWrite,
    /// RDMA READ (send queue).
    RdmaRead,
    /// Compare and swap (send queue).
    CompSwap,
    /// Fetch and add (send queue).
    FetchAdd,
    /// A received SEND (receive queue).
    Recv,
    /// A received RDMA WRITE with immediate (receive queue).
    RecvRdmaWithImm,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode.
    pub opcode: WcOpcode,
    /// QP number.
    pub qpn: u32,
    /// Bytes received (receive completions) or transferred (READ).
    pub byte_len: u32,
    /// Immediate data, if the message carried one.
    pub imm: Option<u32>,
    /// The rkey the peer invalidated (SEND_WITH_INV), if any.
    pub invalidated_rkey: Option<u32>,
    /// A receive completion of a message whose last packet had the BTH solicited-event bit (C9-?: what a CQ armed
    /// for solicited completions only waits for). Not carried in the shared-memory CQE.
    pub solicited: bool,
}

impl Cqe {
    /// An all-zero successful SEND completion: a filler for arrays handed to `poll_cq`.
    pub const EMPTY: Cqe = Cqe {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        qpn: 0,
        byte_len: 0,
        imm: None,
        invalidated_rkey: None,
        solicited: false,
    };
}

/// A completion queue handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CqId(pub u32);

/// A completion queue: a bounded FIFO of CQEs, allocated once.
pub(crate) struct Cq {
    ring: VecDeque<Cqe>,
    depth: usize,
    /// Completions dropped because the queue was full (the QP that overflowed goes to the error state).
    pub(crate) overflows: u64,
}

impl Cq {
    pub(crate) fn new(depth: usize) -> Cq {
        Cq { ring: VecDeque::with_capacity(depth), depth, overflows: 0 }
    }

    /// Appends a CQE; false (and counted) if the queue is full.
    #[inline]
    pub(crate) fn push(&mut self, cqe: Cqe) -> bool {
        if self.ring.len() >= self.depth {
            self.overflows += 1;
            return false;
        }
        self.ring.push_back(cqe);
        true
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<Cqe> {
        self.ring.pop_front()
    }

    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Removes the completions of QP `qpn`, keeping the others in order; `removed` is told the position each
    /// removed one had. Returns how many went.
    pub(crate) fn clean(&mut self, qpn: u32, mut removed: impl FnMut(usize)) -> usize {
        let mut pos = 0;
        let before = self.ring.len();
        self.ring.retain(|c| {
            let keep = c.qpn != qpn;
            if !keep {
                removed(pos);
            }
            pos += 1;
            keep
        });
        before - self.ring.len()
    }

    /// What it holds before it overflows.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// Changes the depth (the memory grows as entries come, not up front).
    pub(crate) fn set_depth(&mut self, depth: usize) {
        self.depth = depth;
    }
}
