//! The shared-memory ABI between applications and the daemon: work-queue and completion entries, and the header
//! that describes a region's rings.
//!
//! Every type here is `#[repr(C)]`, padding-free and made of integers only ([`Pod`](super::ring::Pod)): the bytes
//! in shared memory are whatever the peer wrote, so decoding reads a local copy and validates every field,
//! returning a [`WqeError`] that names the offending field, and never panics. Sizes and offsets are asserted at
//! compile time; a change to any of them needs a new [`ABI_VERSION`].
//!
//! # Send WQE (64 bytes, one cache line)
//! | offset | field | |
//! |---|---|---|
//! | 0 | `wr_id: u64` | returned in the CQE |
//! | 8 | `opcode: u8` | `ibv_wr_opcode` numbers ([`wr_opcode`]) |
//! | 9 | `flags: u8` | `ibv_send_flags` bits: FENCE 1, SIGNALED 2, SOLICITED 4, INLINE 8 ([`send_flags`]) |
//! | 10 | `num_sge: u8` | SGEs of this WR (0 when INLINE) |
//! | 11 | `reserved: u8` | must be 0 |
//! | 12 | `imm_inv: u32` | immediate data (…_WITH_IMM) or the rkey to invalidate (SEND_WITH_INV) |
//! | 16 | `remote_addr: u64` | WRITE, READ, atomics |
//! | 24 | `rkey: u32` | WRITE, READ, atomics |
//! | 28 | `inline_len: u32` | bytes of inline data (INLINE only, else 0) |
//! | 32 | `compare_add: u64` | CMP_SWP compare / FETCH_ADD add |
//! | 40 | `swap: u64` | CMP_SWP swap |
//! | 48 | `sge0: Sge` | the first SGE |
//!
//! **SGEs.** The first SGE is embedded, so the common one-SGE request is a single cache line. SGEs 2..n live in
//! the work queue's side table ([`SlotTable`](super::ring::SlotTable)) of `max_sge - 1` SGEs per ring slot,
//! addressed by the WQE's ring index: no offset or pointer is ever read from shared memory, so there is nothing
//! to bound-check but `num_sge`. **Inline data** likewise lives in a per-slot side area of `max_inline` bytes; the
//! WQE carries only its length. The client library copies the payload there at post time.
//!
//! # Receive WQE (32 bytes)
//! `wr_id: u64`, `num_sge: u8`, 7 reserved bytes (must be 0), `sge0: Sge`; SGEs 2..n in a side table as above.
//!
//! # CQE (32 bytes)
//! `wr_id: u64`, `status: u8` (`ibv_wc_status`), `opcode: u8` (`ibv_wc_opcode`), `wc_flags: u8` (`ibv_wc_flags`
//! bits WITH_IMM 2, WITH_INV 8), `reserved: u8`, `qpn: u32`, `byte_len: u32`, `imm_inv: u32`, `vendor_err: u32`
//! (the daemon's reason code when it failed a WQE: [`WqeError::code`]), `reserved2: u32`.
//!
//! # CQ notification block (384 bytes, after the completion ring; `RegionHeader::notify` gives its offset)
//! | offset | field | written by |
//! |---|---|---|
//! | 0 | `arm: u32` ([`arm_word`]: sequence << 1, bit 0 solicited-only), on its own 128 bytes | the client (`req_notify`) |
//! | 128 | `fired: u32`: the last arm sequence the daemon answered, on its own 128 bytes | the daemon |
//! | 256 | `moderation: u32` ([`moderation_word`]: `cq_count` in bits 0-15, `cq_period` in microseconds in bits 16-31; 0: off), on its own 128 bytes | the client (`set_event_moderation`) |
//!
//! The daemon reads `arm` and `moderation` (hostile: any value only makes the client's own channel fire, or fire
//! later, by at most 65535 us after a completion) and keeps its own copy of
//! what it answered; the client reads `fired` to learn which CQs of a channel fired
//! ([`ctrl::client`](super::client) has the whole protocol and its ordering argument).

use core::fmt;
use core::mem::{offset_of, size_of};

use super::ring::{self, RingCtrl};
use crate::verbs::{self, SendWr, WcOpcode, WcStatus, WrOpcode};

/// Bumped on any change to a layout or to the meaning of a field (2: every CQ region has a [`CqNotify`] block,
/// `RegionHeader::notify`; 3: the block's `moderation` word, 384 bytes).
pub const ABI_VERSION: u32 = 3;

/// First 8 bytes of every region ("RoCEdpSH", little-endian).
pub const REGION_MAGIC: u64 = u64::from_le_bytes(*b"RoCEdpSH");

/// The most SGEs one WQE may carry (the engine's limit).
pub const MAX_WQE_SGE: usize = 32;

/// The most inline bytes per send WQE the daemon grants a QP (`QpInit::max_inline`, rounded up to a multiple of
/// [`INLINE_ALIGN`]): each send-queue slot gets an inline area of that size, in the region and in the engine's QP,
/// so a 4096-deep send queue at the limit holds 4 MiB of inline areas on each side.
pub const MAX_INLINE_DATA: u32 = 1024;

/// The daemon rounds a QP's `max_inline` up to a multiple of this (one cache line per 64 bytes of a slot's area).
pub const INLINE_ALIGN: u32 = 64;

/// A scatter/gather element in shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address in the application's registered region.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// A send work request in shared memory (see the module table).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// [`wr_opcode`] value.
    pub opcode: u8,
    /// [`send_flags`] bits.
    pub flags: u8,
    /// Number of SGEs (first embedded, the rest in the side table).
    pub num_sge: u8,
    /// Must be zero.
    pub reserved: u8,
    /// Immediate data or the rkey to invalidate.
    pub imm_inv: u32,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Inline payload length (INLINE only).
    pub inline_len: u32,
    /// Compare (CMP_SWP) or add (FETCH_ADD) value.
    pub compare_add: u64,
    /// Swap value (CMP_SWP).
    pub swap: u64,
    /// The first SGE.
    pub sge0: Sge,
}

/// A receive work request in shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Number of SGEs (first embedded, the rest in the side table).
    pub num_sge: u8,
    /// Must be zero.
    pub reserved: [u8; 7],
    /// The first SGE.
    pub sge0: Sge,
}

/// A completion in shared memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cqe {
    /// The work request's id.
    pub wr_id: u64,
    /// `ibv_wc_status` number.
    pub status: u8,
    /// `ibv_wc_opcode` number ([`wc_opcode`]).
    pub opcode: u8,
    /// [`wc_flags`] bits.
    pub wc_flags: u8,
    /// Zero.
    pub reserved: u8,
    /// QP number.
    pub qpn: u32,
    /// Bytes received or transferred.
    pub byte_len: u32,
    /// Immediate data (WITH_IMM) or invalidated rkey (WITH_INV).
    pub imm_inv: u32,
    /// Why the daemon failed the WQE ([`WqeError::code`]), 0 otherwise.
    pub vendor_err: u32,
    /// Zero.
    pub reserved2: u32,
}

const _: () = {
    assert!(size_of::<Sge>() == 16);
    assert!(offset_of!(Sge, addr) == 0);
    assert!(offset_of!(Sge, len) == 8);
    assert!(offset_of!(Sge, lkey) == 12);

    assert!(size_of::<Wqe>() == 64);
    assert!(offset_of!(Wqe, wr_id) == 0);
    assert!(offset_of!(Wqe, opcode) == 8);
    assert!(offset_of!(Wqe, flags) == 9);
    assert!(offset_of!(Wqe, num_sge) == 10);
    assert!(offset_of!(Wqe, reserved) == 11);
    assert!(offset_of!(Wqe, imm_inv) == 12);
    assert!(offset_of!(Wqe, remote_addr) == 16);
    assert!(offset_of!(Wqe, rkey) == 24);
    assert!(offset_of!(Wqe, inline_len) == 28);
    assert!(offset_of!(Wqe, compare_add) == 32);
    assert!(offset_of!(Wqe, swap) == 40);
    assert!(offset_of!(Wqe, sge0) == 48);

    assert!(size_of::<RecvWqe>() == 32);
    assert!(offset_of!(RecvWqe, wr_id) == 0);
    assert!(offset_of!(RecvWqe, num_sge) == 8);
    assert!(offset_of!(RecvWqe, reserved) == 9);
    assert!(offset_of!(RecvWqe, sge0) == 16);

    assert!(size_of::<Cqe>() == 32);
    assert!(offset_of!(Cqe, wr_id) == 0);
    assert!(offset_of!(Cqe, status) == 8);
    assert!(offset_of!(Cqe, opcode) == 9);
    assert!(offset_of!(Cqe, wc_flags) == 10);
    assert!(offset_of!(Cqe, reserved) == 11);
    assert!(offset_of!(Cqe, qpn) == 12);
    assert!(offset_of!(Cqe, byte_len) == 16);
    assert!(offset_of!(Cqe, imm_inv) == 20);
    assert!(offset_of!(Cqe, vendor_err) == 24);
    assert!(offset_of!(Cqe, reserved2) == 28);
};

// The `Pod` impls of these types sit in ring.rs (the only module here allowed `unsafe`), justified by the asserts.

/// `ibv_wr_opcode` numbers used in [`Wqe::opcode`].
pub mod wr_opcode {
    /// IBV_WR_RDMA_WRITE.
    pub const RDMA_WRITE: u8 = 0;
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    pub const RDMA_WRITE_WITH_IMM: u8 = 1;
    /// IBV_WR_SEND.
    pub const SEND: u8 = 2;
    /// IBV_WR_SEND_WITH_IMM.
    pub const SEND_WITH_IMM: u8 = 3;
    /// IBV_WR_RDMA_READ.
    pub const RDMA_READ: u8 = 4;
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    pub const ATOMIC_CMP_AND_SWP: u8 = 5;
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    pub const ATOMIC_FETCH_AND_ADD: u8 = 6;
    /// IBV_WR_SEND_WITH_INV.
    pub const SEND_WITH_INV: u8 = 9;
}

/// `ibv_send_flags` bits used in [`Wqe::flags`].
pub mod send_flags {
    /// IBV_SEND_FENCE.
    pub const FENCE: u8 = 1;
    /// IBV_SEND_SIGNALED.
    pub const SIGNALED: u8 = 2;
    /// IBV_SEND_SOLICITED.
    pub const SOLICITED: u8 = 4;
    /// IBV_SEND_INLINE.
    pub const INLINE: u8 = 8;
    /// Every defined bit.
    pub const ALL: u8 = FENCE | SIGNALED | SOLICITED | INLINE;
}

/// `ibv_wc_opcode` numbers used in [`Cqe::opcode`].
pub mod wc_opcode {
    /// IBV_WC_SEND.
    pub const SEND: u8 = 0;
    /// IBV_WC_RDMA_WRITE.
    pub const RDMA_WRITE: u8 = 1;
    /// IBV_WC_RDMA_READ.
    pub const RDMA_READ: u8 = 2;
    /// IBV_WC_COMP_SWAP.
    pub const COMP_SWAP: u8 = 3;
    /// IBV_WC_FETCH_ADD.
    pub const FETCH_ADD: u8 = 4;
    /// IBV_WC_RECV.
    pub const RECV: u8 = 128;
    /// IBV_WC_RECV_RDMA_WITH_IMM.
    pub const RECV_RDMA_WITH_IMM: u8 = 129;
}

/// `ibv_wc_flags` bits used in [`Cqe::wc_flags`].
pub mod wc_flags {
    /// IBV_WC_WITH_IMM.
    pub const WITH_IMM: u8 = 2;
    /// IBV_WC_WITH_INV.
    pub const WITH_INV: u8 = 8;
}

/// What a WQE of one opcode carries into its `SendWr`: the opcode, whether it is a READ or an atomic, and a mask
/// (all ones or zero) per optional field, so that decoding keeps only the fields the opcode uses without a branch
/// or a select per field ([`Wqe::decode_to`], per WR on the worker).
#[derive(Clone, Copy)]
struct OpFields {
    op: WrOpcode,
    rd_atomic: bool,
    atomic: bool,
    remote: u64,
    rkey: u32,
    imm: u32,
    inv: u32,
    compare_add: u64,
    swap: u64,
}

const fn op_fields(code: u8) -> Option<OpFields> {
    const fn m64(on: bool) -> u64 {
        if on {
            u64::MAX
        } else {
            0
        }
    }
    let op = match code {
        wr_opcode::RDMA_WRITE => WrOpcode::RdmaWrite,
        wr_opcode::RDMA_WRITE_WITH_IMM => WrOpcode::RdmaWriteWithImm,
        wr_opcode::SEND => WrOpcode::Send,
        wr_opcode::SEND_WITH_IMM => WrOpcode::SendWithImm,
        wr_opcode::RDMA_READ => WrOpcode::RdmaRead,
        wr_opcode::ATOMIC_CMP_AND_SWP => WrOpcode::AtomicCmpSwp,
        wr_opcode::ATOMIC_FETCH_AND_ADD => WrOpcode::AtomicFetchAdd,
        wr_opcode::SEND_WITH_INV => WrOpcode::SendWithInv,
        _ => return None,
    };
    let remote = !matches!(op, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv);
    let imm = matches!(op, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
    Some(OpFields {
        op,
        rd_atomic: op.is_rd_atomic(),
        atomic: op.is_atomic(),
        remote: m64(remote),
        rkey: m64(remote) as u32,
        imm: m64(imm) as u32,
        inv: m64(matches!(op, WrOpcode::SendWithInv)) as u32,
        compare_add: m64(op.is_atomic()),
        swap: m64(matches!(op, WrOpcode::AtomicCmpSwp)),
    })
}

/// [`op_fields`] of every opcode code up to the largest (the rest are unknown).
const OP_FIELDS: [Option<OpFields>; 10] = {
    let mut t = [None; 10];
    let mut c = 0;
    while c < 10 {
        t[c] = op_fields(c as u8);
        c += 1;
    }
    t
};

/// The [`wr_opcode`] number of a verbs opcode.
pub const fn wr_opcode_code(op: WrOpcode) -> u8 {
    match op {
        WrOpcode::RdmaWrite => wr_opcode::RDMA_WRITE,
        WrOpcode::RdmaWriteWithImm => wr_opcode::RDMA_WRITE_WITH_IMM,
        WrOpcode::Send => wr_opcode::SEND,
        WrOpcode::SendWithImm => wr_opcode::SEND_WITH_IMM,
        WrOpcode::RdmaRead => wr_opcode::RDMA_READ,
        WrOpcode::AtomicCmpSwp => wr_opcode::ATOMIC_CMP_AND_SWP,
        WrOpcode::AtomicFetchAdd => wr_opcode::ATOMIC_FETCH_AND_ADD,
        WrOpcode::SendWithInv => wr_opcode::SEND_WITH_INV,
    }
}

/// The [`wc_opcode`] number of a completion opcode.
pub const fn wc_opcode_code(op: WcOpcode) -> u8 {
    match op {
        WcOpcode::Send => wc_opcode::SEND,
        WcOpcode::RdmaWrite => wc_opcode::RDMA_WRITE,
        WcOpcode::RdmaRead => wc_opcode::RDMA_READ,
        WcOpcode::CompSwap => wc_opcode::COMP_SWAP,
        WcOpcode::FetchAdd => wc_opcode::FETCH_ADD,
        WcOpcode::Recv => wc_opcode::RECV,
        WcOpcode::RecvRdmaWithImm => wc_opcode::RECV_RDMA_WITH_IMM,
    }
}

fn wc_opcode_from(code: u8) -> Option<WcOpcode> {
    const ALL: [WcOpcode; 7] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ];
    ALL.into_iter().find(|&o| wc_opcode_code(o) == code)
}

fn wc_status_from(code: u8) -> Option<WcStatus> {
    const ALL: [WcStatus; 14] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::FatalErr,
    ];
    ALL.into_iter().find(|&s| s.code() == u32::from(code))
}

impl From<Sge> for verbs::Sge {
    fn from(s: Sge) -> verbs::Sge {
        verbs::Sge { addr: s.addr, len: s.len, lkey: s.lkey }
    }
}

impl From<verbs::Sge> for Sge {
    fn from(s: verbs::Sge) -> Sge {
        Sge { addr: s.addr, len: s.len, lkey: s.lkey }
    }
}

/// Per-QP limits a WQE is validated against (the QP's capabilities, fixed at creation by the daemon).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WqeLimits {
    /// SGEs per WQE (at most [`MAX_WQE_SGE`]).
    pub max_sge: u8,
    /// Inline bytes per WQE (the per-slot inline area).
    pub max_inline: u32,
}

/// A field of a WQE read from shared memory that the daemon refuses. Each names the field; the QP goes to the
/// error state with [`WcStatus::LocQpOpErr`] and `vendor_err = code()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqeError {
    /// `opcode` is not a known work-request opcode.
    UnknownOpcode(u8),
    /// `flags` has bits outside [`send_flags::ALL`].
    UnknownFlags(u8),
    /// A reserved field is not zero.
    Reserved {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// `num_sge` exceeds the QP's max_sge.
    TooManySge {
        /// The WQE's num_sge.
        num_sge: u8,
        /// The QP's limit.
        max: u8,
    },
    /// `inline_len` exceeds the QP's max_inline.
    InlineTooLong {
        /// The WQE's inline_len.
        len: u32,
        /// The QP's limit.
        max: u32,
    },
    /// INLINE on an opcode without payload (READ, atomics).
    InlineNotAllowed(u8),
    /// INLINE together with SGEs (inline payload comes from the inline area only).
    InlineWithSge(u8),
    /// The SGE lengths add up to more than 2^31 bytes.
    MessageTooLong(u64),
    /// An atomic whose SGE list is not one SGE of 8 bytes.
    AtomicLength(u64),
}

impl WqeError {
    /// The WQE field at fault.
    pub const fn field(&self) -> &'static str {
        match self {
            WqeError::UnknownOpcode(_) | WqeError::InlineNotAllowed(_) => "opcode",
            WqeError::UnknownFlags(_) => "flags",
            WqeError::Reserved { field, .. } => field,
            WqeError::TooManySge { .. } | WqeError::InlineWithSge(_) => "num_sge",
            WqeError::InlineTooLong { .. } => "inline_len",
            WqeError::MessageTooLong(_) | WqeError::AtomicLength(_) => "sge.len",
        }
    }

    /// A stable number for [`Cqe::vendor_err`] (1-based, never 0).
    pub const fn code(&self) -> u32 {
        match self {
            WqeError::UnknownOpcode(_) => 1,
            WqeError::UnknownFlags(_) => 2,
            WqeError::Reserved { .. } => 3,
            WqeError::TooManySge { .. } => 4,
            WqeError::InlineTooLong { .. } => 5,
            WqeError::InlineNotAllowed(_) => 6,
            WqeError::InlineWithSge(_) => 7,
            WqeError::MessageTooLong(_) => 8,
            WqeError::AtomicLength(_) => 9,
        }
    }
}

impl fmt::Display for WqeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.field();
        match *self {
            WqeError::UnknownOpcode(v) => write!(f, "WQE field `{field}` = {v} is not a known work-request opcode"),
            WqeError::UnknownFlags(v) => {
                write!(f, "WQE field `{field}` = {v:#04x} has bits outside {:#04x}", send_flags::ALL)
            }
            WqeError::Reserved { value, .. } => write!(f, "WQE field `{field}` is reserved but holds {value:#x}"),
            WqeError::TooManySge { num_sge, max } => {
                write!(f, "WQE field `{field}` = {num_sge} exceeds the QP's max_sge {max}")
            }
            WqeError::InlineTooLong { len, max } => {
                write!(f, "WQE field `{field}` = {len} exceeds the QP's max_inline {max}")
            }
            WqeError::InlineNotAllowed(op) => write!(f, "INLINE is not allowed with WQE `{field}` = {op}"),
            WqeError::InlineWithSge(n) => write!(f, "an INLINE WQE must have `{field}` = 0, not {n}"),
            WqeError::MessageTooLong(n) => write!(f, "WQE `{field}` values add up to {n} bytes, over 2^31"),
            WqeError::AtomicLength(n) => write!(f, "an atomic WQE needs one SGE of 8 bytes, `{field}` total is {n}"),
        }
    }
}

impl std::error::Error for WqeError {}

/// A fixed-capacity SGE list (no allocation on the data path). Decoders fill one in place, so the 512 bytes are
/// neither zeroed nor moved per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SgeList {
    len: u8,
    sges: [verbs::Sge; MAX_WQE_SGE],
}

impl SgeList {
    /// An empty list.
    pub const EMPTY: SgeList = SgeList { len: 0, sges: [verbs::Sge { addr: 0, len: 0, lkey: 0 }; MAX_WQE_SGE] };

    /// The SGEs.
    #[inline]
    pub fn as_slice(&self) -> &[verbs::Sge] {
        &self.sges[..usize::from(self.len)]
    }

    /// Total bytes.
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|s| u64::from(s.len)).sum()
    }
}

impl Default for SgeList {
    fn default() -> SgeList {
        SgeList::EMPTY
    }
}

/// Fills `list` with `num_sge` SGEs (validated against `max_sge` first): the embedded one, then `ext(k)` for
/// k in 1..num_sge, which copies SGE k of the slot out of the side table. Returns their total length (summed as
/// they are copied: no second pass over the list).
#[inline(always)]
fn gather(
    list: &mut SgeList,
    num_sge: u8,
    max_sge: u8,
    sge0: Sge,
    ext: impl FnMut(usize) -> Sge,
) -> Result<u64, WqeError> {
    let r = gather_to(&mut list.sges, num_sge, max_sge, sge0, ext);
    list.len = if r.is_ok() { num_sge } else { 0 };
    r
}

/// [`gather`] into any SGE array: at most `max_sge` and `to.len()` SGEs.
#[inline(always)]
fn gather_to(
    to: &mut [verbs::Sge],
    num_sge: u8,
    max_sge: u8,
    sge0: Sge,
    mut ext: impl FnMut(usize) -> Sge,
) -> Result<u64, WqeError> {
    let max = max_sge.min(u8::try_from(to.len()).unwrap_or(u8::MAX));
    let n = usize::from(num_sge);
    let Some(list) = to.get_mut(..n).filter(|_| num_sge <= max) else {
        return Err(WqeError::TooManySge { num_sge, max });
    };
    let Some((first, rest)) = list.split_first_mut() else {
        return Ok(0);
    };
    *first = sge0.into();
    let mut total = u64::from(sge0.len);
    for (k, d) in rest.iter_mut().enumerate() {
        let s = ext(k + 1);
        total += u64::from(s.len);
        *d = s.into();
    }
    Ok(total)
}

/// A validated send request decoded from a [`Wqe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendRequest {
    /// The work request (fields the opcode does not use are zero).
    pub wr: SendWr,
    /// Its SGEs (empty when inline).
    pub sges: SgeList,
    /// Bytes of inline payload in the slot's inline area (0 unless `wr.inline`).
    pub inline_len: u32,
}

impl Default for SendRequest {
    fn default() -> SendRequest {
        SendRequest { wr: SendWr::new(0, WrOpcode::Send), sges: SgeList::EMPTY, inline_len: 0 }
    }
}

/// What [`Wqe::decode_to`] wrote: `num_sge` SGEs, or (`wr.inline`) `inline_len` bytes of inline payload waiting in
/// the slot's inline area.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// SGEs written (0 when inline).
    pub num_sge: u8,
    /// Bytes of inline payload (0 unless inline).
    pub inline_len: u32,
}

impl Wqe {
    /// Validates this (local copy of a) WQE into `out` (left partly written on error). `ext(k)` is called for
    /// k in 1..num_sge, only after `num_sge` was checked against `limits`, to copy SGE k out of the slot's side
    /// table. Inlined into the worker's ring loop: per WR it is a handful of compares and the stores of `out`
    /// (session 15: a call, its saved registers and a second pass over the SGEs were half of its cost).
    #[inline(always)]
    pub fn decode_into(
        &self,
        limits: WqeLimits,
        out: &mut SendRequest,
        ext: impl FnMut(usize) -> Sge,
    ) -> Result<(), WqeError> {
        out.sges.len = 0;
        let d = self.decode_to(limits, &mut out.wr, &mut out.sges.sges, ext)?;
        out.sges.len = d.num_sge;
        out.inline_len = d.inline_len;
        Ok(())
    }

    /// [`decode_into`](Self::decode_into) into a WR and an SGE array anywhere (the engine's send-queue slot, see
    /// `Engine::post_sends_with`): at most `sges.len()` SGEs (more is [`WqeError::TooManySge`], as more than
    /// `limits.max_sge` is). Both are left partly written on error.
    #[inline(always)]
    pub fn decode_to(
        &self,
        limits: WqeLimits,
        wr: &mut SendWr,
        sges: &mut [verbs::Sge],
        ext: impl FnMut(usize) -> Sge,
    ) -> Result<Decoded, WqeError> {
        let f = OP_FIELDS.get(usize::from(self.opcode)).copied().flatten();
        let f = f.ok_or(WqeError::UnknownOpcode(self.opcode))?;
        if self.flags & !send_flags::ALL != 0 {
            return Err(WqeError::UnknownFlags(self.flags));
        }
        if self.reserved != 0 {
            return Err(WqeError::Reserved { field: "reserved", value: u64::from(self.reserved) });
        }
        let inline = self.flags & send_flags::INLINE != 0;
        // Copy only what the opcode uses, so stray bytes never travel further (the opcode's masks). Written before
        // the remaining checks (on error `wr` is left written, as documented, and the caller does not post it):
        // stored now, the WQE's words need not stay in registers or on the stack through the checks (session 18:
        // the worker's loop spilled them).
        *wr = SendWr {
            wr_id: self.wr_id,
            opcode: f.op,
            signaled: self.flags & send_flags::SIGNALED != 0,
            fence: self.flags & send_flags::FENCE != 0,
            solicited: self.flags & send_flags::SOLICITED != 0,
            inline,
            imm: self.imm_inv & f.imm,
            invalidate_rkey: self.imm_inv & f.inv,
            remote_addr: self.remote_addr & f.remote,
            rkey: self.rkey & f.rkey,
            compare_add: self.compare_add & f.compare_add,
            swap: self.swap & f.swap,
        };
        let (d, total) = if inline {
            if f.rd_atomic {
                return Err(WqeError::InlineNotAllowed(self.opcode));
            }
            if self.num_sge != 0 {
                return Err(WqeError::InlineWithSge(self.num_sge));
            }
            if self.inline_len > limits.max_inline {
                return Err(WqeError::InlineTooLong { len: self.inline_len, max: limits.max_inline });
            }
            (Decoded { num_sge: 0, inline_len: self.inline_len }, 0)
        } else {
            if self.inline_len != 0 {
                return Err(WqeError::Reserved { field: "inline_len", value: u64::from(self.inline_len) });
            }
            let total = gather_to(sges, self.num_sge, limits.max_sge, self.sge0, ext)?;
            (Decoded { num_sge: self.num_sge, inline_len: 0 }, total)
        };
        if total > crate::qp::MAX_MSG_LEN {
            return Err(WqeError::MessageTooLong(total));
        }
        if f.atomic && (d.num_sge != 1 || total != 8) {
            return Err(WqeError::AtomicLength(total));
        }
        Ok(d)
    }

    /// [`decode_into`](Self::decode_into) returning the request by value.
    pub fn decode(&self, limits: WqeLimits, ext: impl FnMut(usize) -> Sge) -> Result<SendRequest, WqeError> {
        let mut out = SendRequest::default();
        self.decode_into(limits, &mut out, ext)?;
        Ok(out)
    }

    /// Encodes a send request (client side). `sgl[0]` is embedded; the caller writes `sgl[1..]` into the side
    /// table. With `wr.inline`, pass the payload length as `inline_len` and an empty `sgl`.
    #[inline]
    pub fn encode(wr: &SendWr, sgl: &[verbs::Sge], inline_len: u32) -> Wqe {
        Wqe::encode_as(wr, wr.inline, sgl, inline_len)
    }

    /// [`encode`](Self::encode) with `inline` in place of `wr.inline` (the writers decide it, not the WR), without
    /// a copy of the WR to change it. The flags are computed without branches: the client's post is per WR.
    #[inline]
    pub(crate) fn encode_as(wr: &SendWr, inline: bool, sgl: &[verbs::Sge], inline_len: u32) -> Wqe {
        let bit = |on: bool, flag: u8| u8::from(on) * flag;
        let flags = bit(wr.signaled, send_flags::SIGNALED)
            | bit(wr.fence, send_flags::FENCE)
            | bit(wr.solicited, send_flags::SOLICITED)
            | bit(inline, send_flags::INLINE);
        Wqe {
            wr_id: wr.wr_id,
            opcode: wr_opcode_code(wr.opcode),
            flags,
            num_sge: u8::try_from(sgl.len()).unwrap_or(u8::MAX),
            reserved: 0,
            imm_inv: if wr.opcode == WrOpcode::SendWithInv { wr.invalidate_rkey } else { wr.imm },
            remote_addr: wr.remote_addr,
            rkey: wr.rkey,
            inline_len: if inline { inline_len } else { 0 },
            compare_add: wr.compare_add,
            swap: wr.swap,
            sge0: sgl.first().copied().map(Sge::from).unwrap_or_default(),
        }
    }
}

impl RecvWqe {
    /// Validates this (local copy of a) receive WQE, filling `sges` in place; returns its `wr_id`. `ext` as in
    /// [`Wqe::decode_into`].
    pub fn decode_into(&self, max_sge: u8, sges: &mut SgeList, ext: impl FnMut(usize) -> Sge) -> Result<u64, WqeError> {
        if self.reserved != [0; 7] {
            return Err(WqeError::Reserved { field: "reserved", value: u64::from_le_bytes(pad8(self.reserved)) });
        }
        let total = gather(sges, self.num_sge, max_sge, self.sge0, ext)?;
        if total > crate::qp::MAX_MSG_LEN {
            return Err(WqeError::MessageTooLong(total));
        }
        Ok(self.wr_id)
    }

    /// [`decode_into`](Self::decode_into) returning `(wr_id, sges)` by value.
    pub fn decode(&self, max_sge: u8, ext: impl FnMut(usize) -> Sge) -> Result<(u64, SgeList), WqeError> {
        let mut sges = SgeList::EMPTY;
        let id = self.decode_into(max_sge, &mut sges, ext)?;
        Ok((id, sges))
    }

    /// Encodes a receive request; the caller writes `sgl[1..]` into the side table.
    pub fn encode(wr_id: u64, sgl: &[verbs::Sge]) -> RecvWqe {
        RecvWqe {
            wr_id,
            num_sge: u8::try_from(sgl.len()).unwrap_or(u8::MAX),
            reserved: [0; 7],
            sge0: sgl.first().copied().map(Sge::from).unwrap_or_default(),
        }
    }
}

fn pad8(b: [u8; 7]) -> [u8; 8] {
    let mut o = [0; 8];
    o[..7].copy_from_slice(&b);
    o
}

/// A CQE from the daemon that the client library cannot decode (only a daemon of another ABI writes these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqeError {
    /// Unknown `status`.
    Status(u8),
    /// Unknown `opcode`.
    Opcode(u8),
}

impl fmt::Display for CqeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CqeError::Status(s) => write!(f, "CQE field `status` = {s} is not a known ibv_wc_status"),
            CqeError::Opcode(o) => write!(f, "CQE field `opcode` = {o} is not a known ibv_wc_opcode"),
        }
    }
}

impl std::error::Error for CqeError {}

impl From<&verbs::Cqe> for Cqe {
    fn from(c: &verbs::Cqe) -> Cqe {
        let mut wc_flags = 0;
        let mut imm_inv = 0;
        if let Some(imm) = c.imm {
            wc_flags |= wc_flags::WITH_IMM;
            imm_inv = imm;
        } else if let Some(rkey) = c.invalidated_rkey {
            wc_flags |= wc_flags::WITH_INV;
            imm_inv = rkey;
        }
        Cqe {
            wr_id: c.wr_id,
            // ibv_wc_status numbers are all below 256.
            status: c.status.code() as u8,
            opcode: wc_opcode_code(c.opcode),
            wc_flags,
            reserved: 0,
            qpn: c.qpn,
            byte_len: c.byte_len,
            imm_inv,
            vendor_err: 0,
            reserved2: 0,
        }
    }
}

impl Cqe {
    /// A CQE failing a WQE that the daemon refused (status LocQpOpErr, `vendor_err` = the reason).
    pub fn refused(wr_id: u64, qpn: u32, opcode: WcOpcode, why: &WqeError) -> Cqe {
        Cqe {
            wr_id,
            status: WcStatus::LocQpOpErr.code() as u8,
            opcode: wc_opcode_code(opcode),
            qpn,
            vendor_err: why.code(),
            ..Cqe::default()
        }
    }

    /// Decodes (client side). Immediate and invalidated rkey are exclusive (`WITH_IMM` wins).
    pub fn decode(&self) -> Result<verbs::Cqe, CqeError> {
        let status = wc_status_from(self.status).ok_or(CqeError::Status(self.status))?;
        let opcode = wc_opcode_from(self.opcode).ok_or(CqeError::Opcode(self.opcode))?;
        let imm = (self.wc_flags & wc_flags::WITH_IMM != 0).then_some(self.imm_inv);
        let inv = (imm.is_none() && self.wc_flags & wc_flags::WITH_INV != 0).then_some(self.imm_inv);
        Ok(verbs::Cqe {
            wr_id: self.wr_id,
            status,
            opcode,
            qpn: self.qpn,
            byte_len: self.byte_len,
            imm,
            invalidated_rkey: inv,
            solicited: false,
        })
    }
}

/// What a region holds.
pub mod region_kind {
    /// A QP's send and receive queues (with their side tables).
    pub const QP: u32 = 1;
    /// A CQ's completion ring.
    pub const CQ: u32 = 2;
}

/// Where one ring lies in its region.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingDesc {
    /// Byte offset of the ring's control block from the region start (a multiple of 128).
    pub offset: u64,
    /// Entries (a power of two).
    pub capacity: u32,
    /// Bytes per entry.
    pub entry_size: u32,
}

/// Where one side table lies in its region.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableDesc {
    /// Byte offset from the region start.
    pub offset: u64,
    /// Elements per ring slot.
    pub per_slot: u32,
    /// Bytes per element.
    pub elem_size: u32,
}

/// The first bytes of every region, written by the daemon when it creates the region. The client checks it
/// ([`RegionHeader::check`]); the daemon never reads it back (the client can write it) and keeps its own copy.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegionHeader {
    /// [`REGION_MAGIC`].
    pub magic: u64,
    /// [`ABI_VERSION`] of the daemon that made the region.
    pub abi_version: u32,
    /// [`region_kind`].
    pub kind: u32,
    /// Total bytes of the region.
    pub region_len: u64,
    /// Send queue (QP) or completion ring (CQ).
    pub sq: RingDesc,
    /// Receive queue (QP; zero for a CQ).
    pub rq: RingDesc,
    /// Send SGEs 2..n, `max_send_sge - 1` per slot.
    pub sq_sges: TableDesc,
    /// Receive SGEs 2..n, `max_recv_sge - 1` per slot.
    pub rq_sges: TableDesc,
    /// Inline payload, `max_inline` bytes per send slot.
    pub sq_inline: TableDesc,
    /// Byte offset of the CQ's [`CqNotify`] block (a multiple of 128; zero in a QP region).
    pub notify: u64,
    /// Zero.
    pub reserved: [u64; 2],
}

const _: () = {
    assert!(size_of::<RingDesc>() == 16);
    assert!(size_of::<TableDesc>() == 16);
    assert!(size_of::<RegionHeader>() == 128);
    assert!(offset_of!(RegionHeader, magic) == 0);
    assert!(offset_of!(RegionHeader, abi_version) == 8);
    assert!(offset_of!(RegionHeader, kind) == 12);
    assert!(offset_of!(RegionHeader, region_len) == 16);
    assert!(offset_of!(RegionHeader, sq) == 24);
    assert!(offset_of!(RegionHeader, rq) == 40);
    assert!(offset_of!(RegionHeader, sq_sges) == 56);
    assert!(offset_of!(RegionHeader, rq_sges) == 72);
    assert!(offset_of!(RegionHeader, sq_inline) == 88);
    assert!(offset_of!(RegionHeader, notify) == 104);
    assert!(offset_of!(RegionHeader, reserved) == 112);
    assert!(size_of::<CqNotify>() == 384);
    assert!(offset_of!(CqNotify, arm) == 0);
    assert!(offset_of!(CqNotify, fired) == 128);
    assert!(offset_of!(CqNotify, moderation) == 256);
};

/// A CQ's notification block in shared memory (see the module table): the client's arm word and the daemon's
/// answer, each on its own 128 bytes (the daemon reads `arm` once per batch of completions it writes).
#[repr(C)]
pub struct CqNotify {
    /// [`arm_word`] of the client's last `req_notify` (0: never armed).
    pub arm: crossbeam_utils::CachePadded<core::sync::atomic::AtomicU32>,
    /// The arm sequence the daemon answered last (it signalled the channel for it).
    pub fired: crossbeam_utils::CachePadded<core::sync::atomic::AtomicU32>,
    /// [`moderation_word`] of the client's event moderation (`ibv_modify_cq`'s `cq_count` / `cq_period`; 0: an
    /// armed CQ fires on its first completion).
    pub moderation: crossbeam_utils::CachePadded<core::sync::atomic::AtomicU32>,
}

/// The moderation word: an armed CQ's event waits until `count` completions were written since the arm was
/// answered last, or `period_us` microseconds after the first of them, whichever comes first. `count <= 1` or
/// `period_us == 0` means no moderation (the client library refuses the combinations that would mean "never").
pub const fn moderation_word(count: u16, period_us: u16) -> u32 {
    (count as u32) | ((period_us as u32) << 16)
}

/// A moderation word's `(count, period_us)`.
pub const fn moderation_parts(word: u32) -> (u16, u16) {
    (word as u16, (word >> 16) as u16)
}

/// Bit 0 of the arm word: only a solicited completion (or an error) answers this arm (`ibv_req_notify_cq(cq, 1)`).
pub const ARM_SOLICITED: u32 = 1;

/// The arm word for sequence `seq` (31 bits, never 0 for a real arm).
pub const fn arm_word(seq: u32, solicited_only: bool) -> u32 {
    (seq << 1) | if solicited_only { ARM_SOLICITED } else { 0 }
}

/// The next arm sequence after `seq` (31 bits, skipping 0, which means "never armed").
pub const fn next_arm_seq(seq: u32) -> u32 {
    match seq.wrapping_add(1) & 0x7fff_ffff {
        0 => 1,
        n => n,
    }
}

/// A region the client cannot use, with what to do about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbiError {
    /// Not a roce-dp region at all.
    BadMagic(u64),
    /// Made by a daemon speaking another ABI version.
    Version {
        /// The daemon's version.
        daemon: u32,
        /// This library's version.
        library: u32,
    },
    /// Another kind of region than expected.
    Kind {
        /// Found.
        found: u32,
        /// Expected.
        expected: u32,
    },
    /// A ring or table lies (partly) outside the region, overlaps another or is misaligned.
    Geometry(&'static str),
    /// Queue sizes the layout cannot express.
    BadSize(&'static str, u64),
}

impl fmt::Display for AbiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AbiError::BadMagic(m) => write!(f, "shared region has magic {m:#018x}: not a roce-dp region"),
            AbiError::Version { daemon, library } => write!(
                f,
                "roce-dpd speaks shared-memory ABI v{daemon} but this library speaks v{library}: rebuild the \
                 application against the daemon's roce-dp version"
            ),
            AbiError::Kind { found, expected } => write!(f, "shared region is of kind {found}, expected {expected}"),
            AbiError::Geometry(what) => write!(f, "shared region header is inconsistent: {what}"),
            AbiError::BadSize(what, v) => write!(f, "{what} = {v} cannot be laid out in a shared region"),
        }
    }
}

impl std::error::Error for AbiError {}

const PAST_END: &str = "a ring or table extends past region_len";

/// The byte span `[offset, offset + bytes)` of a ring, table or block; one whose end is past 2^64 cannot fit any
/// region (the header is the peer's: its offsets are any value).
fn span(offset: u64, bytes: u64) -> Result<(u64, u64), AbiError> {
    offset.checked_add(bytes).map(|end| (offset, end)).ok_or(AbiError::Geometry(PAST_END))
}

const fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Capacity for a requested depth: the next power of two (at least 1).
fn capacity(depth: u32, what: &'static str) -> Result<u32, AbiError> {
    let c = depth.max(1).checked_next_power_of_two().ok_or(AbiError::BadSize(what, u64::from(depth)))?;
    if c > ring::MAX_CAPACITY {
        return Err(AbiError::BadSize(what, u64::from(depth)));
    }
    Ok(c)
}

/// Lays out regions (daemon side).
struct Cursor(u64);

impl Cursor {
    fn ring(&mut self, capacity: u32, entry_size: usize) -> RingDesc {
        let offset = round_up(self.0, ring::RING_ALIGN as u64);
        let bytes = ring::ring_bytes(capacity, entry_size).expect("capacity <= 2^30, entries <= 64 bytes") as u64;
        self.0 = offset + bytes;
        RingDesc { offset, capacity, entry_size: entry_size as u32 }
    }
    fn table(&mut self, capacity: u32, per_slot: u32, elem_size: usize) -> TableDesc {
        if per_slot == 0 {
            return TableDesc::default();
        }
        let offset = round_up(self.0, 64);
        self.0 = offset + u64::from(capacity) * u64::from(per_slot) * elem_size as u64;
        TableDesc { offset, per_slot, elem_size: elem_size as u32 }
    }
}

impl RegionHeader {
    /// The layout of a QP region (daemon side): queue depths are rounded up to powers of two.
    pub fn qp(
        sq_depth: u32,
        rq_depth: u32,
        max_send_sge: u8,
        max_recv_sge: u8,
        max_inline: u32,
    ) -> Result<Self, AbiError> {
        for (what, v) in [("max_send_sge", max_send_sge), ("max_recv_sge", max_recv_sge)] {
            if usize::from(v) > MAX_WQE_SGE {
                return Err(AbiError::BadSize(what, u64::from(v)));
            }
        }
        if max_inline > 1 << 16 {
            return Err(AbiError::BadSize("max_inline", u64::from(max_inline)));
        }
        let sq_cap = capacity(sq_depth, "send queue depth")?;
        let rq_cap = capacity(rq_depth, "receive queue depth")?;
        let mut c = Cursor(size_of::<RegionHeader>() as u64);
        let sq = c.ring(sq_cap, size_of::<Wqe>());
        let rq = c.ring(rq_cap, size_of::<RecvWqe>());
        let sq_sges = c.table(sq_cap, u32::from(max_send_sge.saturating_sub(1)), size_of::<Sge>());
        let rq_sges = c.table(rq_cap, u32::from(max_recv_sge.saturating_sub(1)), size_of::<Sge>());
        let sq_inline = c.table(sq_cap, max_inline, 1);
        Ok(RegionHeader {
            magic: REGION_MAGIC,
            abi_version: ABI_VERSION,
            kind: region_kind::QP,
            region_len: round_up(c.0, 4096),
            sq,
            rq,
            sq_sges,
            rq_sges,
            sq_inline,
            notify: 0,
            reserved: [0; 2],
        })
    }

    /// The layout of a CQ region (daemon side).
    pub fn cq(depth: u32) -> Result<Self, AbiError> {
        let cap = capacity(depth, "completion queue depth")?;
        let mut c = Cursor(size_of::<RegionHeader>() as u64);
        let sq = c.ring(cap, size_of::<Cqe>());
        let notify = round_up(c.0, ring::RING_ALIGN as u64);
        c.0 = notify + size_of::<CqNotify>() as u64;
        Ok(RegionHeader {
            magic: REGION_MAGIC,
            abi_version: ABI_VERSION,
            kind: region_kind::CQ,
            region_len: round_up(c.0, 4096),
            sq,
            notify,
            ..RegionHeader::default()
        })
    }

    /// Checks a header read from a mapped region of `mapped_len` bytes (client side): magic, version, kind, and
    /// that every ring and table lies inside the mapping, aligned, without overlaps.
    pub fn check(&self, expected_kind: u32, mapped_len: usize) -> Result<(), AbiError> {
        if self.magic != REGION_MAGIC {
            return Err(AbiError::BadMagic(self.magic));
        }
        if self.abi_version != ABI_VERSION {
            return Err(AbiError::Version { daemon: self.abi_version, library: ABI_VERSION });
        }
        if self.kind != expected_kind {
            return Err(AbiError::Kind { found: self.kind, expected: expected_kind });
        }
        if self.region_len > mapped_len as u64 {
            return Err(AbiError::Geometry("region_len exceeds the mapping"));
        }
        let mut spans: Vec<(u64, u64)> = vec![(0, size_of::<RegionHeader>() as u64)];
        let rings: &[(RingDesc, usize)] = if self.kind == region_kind::QP {
            &[(self.sq, size_of::<Wqe>()), (self.rq, size_of::<RecvWqe>())]
        } else {
            &[(self.sq, size_of::<Cqe>())]
        };
        for (r, size) in rings {
            if r.entry_size as usize != *size {
                return Err(AbiError::Geometry("ring entry size"));
            }
            if r.capacity == 0 || !r.capacity.is_power_of_two() || r.capacity > ring::MAX_CAPACITY {
                return Err(AbiError::Geometry("ring capacity"));
            }
            if r.offset % ring::RING_ALIGN as u64 != 0 {
                return Err(AbiError::Geometry("ring alignment"));
            }
            let bytes = u64::from(r.capacity) * *size as u64 + size_of::<RingCtrl>() as u64; // <= 2^30 * 64 + 256
            spans.push(span(r.offset, bytes)?);
        }
        if self.kind == region_kind::CQ {
            if self.notify == 0 || !self.notify.is_multiple_of(ring::RING_ALIGN as u64) {
                return Err(AbiError::Geometry("notification block offset"));
            }
            spans.push(span(self.notify, size_of::<CqNotify>() as u64)?);
        } else if self.notify != 0 {
            return Err(AbiError::Geometry("notification block in a QP region"));
        }
        if self.kind == region_kind::QP {
            for (t, cap, size) in [
                (self.sq_sges, self.sq.capacity, size_of::<Sge>()),
                (self.rq_sges, self.rq.capacity, size_of::<Sge>()),
                (self.sq_inline, self.sq.capacity, 1),
            ] {
                if t.per_slot == 0 {
                    continue;
                }
                if t.elem_size as usize != size || t.offset % 8 != 0 {
                    return Err(AbiError::Geometry("side table element size or alignment"));
                }
                let bytes = (u64::from(cap) * u64::from(t.per_slot)).checked_mul(size as u64); // cap <= 2^30
                spans.push(span(t.offset, bytes.ok_or(AbiError::Geometry(PAST_END))?)?);
            }
        }
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(AbiError::Geometry("rings or tables overlap"));
            }
        }
        if spans.last().is_some_and(|s| s.1 > self.region_len) {
            return Err(AbiError::Geometry(PAST_END));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WqeLimits = WqeLimits { max_sge: 4, max_inline: 64 };

    fn sge(i: u32) -> verbs::Sge {
        verbs::Sge { addr: 0x1000 * u64::from(i), len: 8 * i, lkey: 0x100 + i }
    }

    #[test]
    fn decoding_keeps_only_the_fields_each_opcode_uses() {
        for code in 0..=u8::MAX {
            let wqe = Wqe {
                wr_id: 9,
                opcode: code,
                flags: send_flags::SIGNALED,
                num_sge: 1,
                reserved: 0,
                imm_inv: 0x1111_2222,
                remote_addr: 0x3333_4444_5555_6666,
                rkey: 0x7777_8888,
                inline_len: 0,
                compare_add: 0x9999_aaaa_bbbb_cccc,
                swap: 0xdddd_eeee_ffff_0001,
                sge0: verbs::Sge { addr: 8, len: 8, lkey: 1 }.into(),
            };
            let Some(op) = WrOpcode::ALL.iter().copied().find(|&op| wr_opcode_code(op) == code) else {
                assert_eq!(wqe.decode(LIMITS, |_| Sge::default()), Err(WqeError::UnknownOpcode(code)));
                continue;
            };
            let got = wqe.decode(LIMITS, |_| Sge::default()).unwrap().wr;
            let remote = !matches!(op, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv);
            let imm = matches!(op, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm);
            let want = SendWr {
                wr_id: 9,
                opcode: op,
                signaled: true,
                fence: false,
                solicited: false,
                inline: false,
                imm: if imm { 0x1111_2222 } else { 0 },
                invalidate_rkey: if op == WrOpcode::SendWithInv { 0x1111_2222 } else { 0 },
                remote_addr: if remote { 0x3333_4444_5555_6666 } else { 0 },
                rkey: if remote { 0x7777_8888 } else { 0 },
                compare_add: if op.is_atomic() { 0x9999_aaaa_bbbb_cccc } else { 0 },
                swap: if op == WrOpcode::AtomicCmpSwp { 0xdddd_eeee_ffff_0001 } else { 0 },
            };
            assert_eq!(got, want, "{op:?}");
        }
    }

    #[test]
    fn encode_decode_round_trip_every_opcode() {
        for op in WrOpcode::ALL {
            let mut wr = SendWr::new(0xdead_beef_0000 + wr_opcode_code(op) as u64, op).remote(0x7000, 0x42);
            wr.fence = true;
            wr.solicited = op == WrOpcode::Send;
            wr.imm = if matches!(op, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm) { 77 } else { 0 };
            wr.invalidate_rkey = if op == WrOpcode::SendWithInv { 0x55 } else { 0 };
            if matches!(op, WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv) {
                wr.remote_addr = 0;
                wr.rkey = 0;
            }
            if op.is_atomic() {
                wr.compare_add = 3;
                wr.swap = if op == WrOpcode::AtomicCmpSwp { 4 } else { 0 };
            }
            let sgl: Vec<verbs::Sge> =
                if op.is_atomic() { vec![verbs::Sge { addr: 8, len: 8, lkey: 1 }] } else { (1..=3).map(sge).collect() };
            let wqe = Wqe::encode(&wr, &sgl, 0);
            let mut asked = Vec::new();
            let got = wqe
                .decode(LIMITS, |k| {
                    asked.push(k);
                    sgl[k].into()
                })
                .unwrap();
            assert_eq!(asked, (1..sgl.len()).collect::<Vec<_>>());
            assert_eq!(got.wr, wr, "{op:?}");
            assert_eq!(got.sges.as_slice(), &sgl[..]);
            assert_eq!(got.inline_len, 0);
        }
    }

    #[test]
    fn inline_round_trip() {
        let mut wr = SendWr::new(5, WrOpcode::SendWithImm);
        wr.inline = true;
        wr.imm = 9;
        let got = Wqe::encode(&wr, &[], 64).decode(LIMITS, |_| panic!("no side SGEs for inline")).unwrap();
        assert_eq!(got.wr, wr);
        assert_eq!(got.inline_len, 64);
        assert!(got.sges.as_slice().is_empty());
    }

    #[test]
    fn decode_names_the_bad_field() {
        let good = Wqe::encode(&SendWr::new(1, WrOpcode::Send), &[sge(2)], 0);
        let cases: [(Wqe, WqeError); 9] = [
            (Wqe { opcode: 7, ..good }, WqeError::UnknownOpcode(7)),
            (Wqe { flags: 0x12, ..good }, WqeError::UnknownFlags(0x12)),
            (Wqe { reserved: 1, ..good }, WqeError::Reserved { field: "reserved", value: 1 }),
            (Wqe { inline_len: 3, ..good }, WqeError::Reserved { field: "inline_len", value: 3 }),
            (Wqe { num_sge: 200, ..good }, WqeError::TooManySge { num_sge: 200, max: 4 }),
            (
                Wqe { flags: send_flags::INLINE, inline_len: 65, num_sge: 0, ..good },
                WqeError::InlineTooLong { len: 65, max: 64 },
            ),
            (Wqe { flags: send_flags::INLINE, ..good }, WqeError::InlineWithSge(1)),
            (
                Wqe { flags: send_flags::INLINE, opcode: wr_opcode::RDMA_READ, num_sge: 0, ..good },
                WqeError::InlineNotAllowed(wr_opcode::RDMA_READ),
            ),
            (Wqe { opcode: wr_opcode::ATOMIC_FETCH_AND_ADD, ..good }, WqeError::AtomicLength(16)),
        ];
        let mut codes = std::collections::HashSet::new();
        for (wqe, want) in cases {
            let got = wqe.decode(LIMITS, |_| Sge::default()).unwrap_err();
            assert_eq!(got, want);
            assert!(got.to_string().contains(got.field()), "{got}");
            codes.insert(got.code());
        }
        assert_eq!(codes.len(), 8, "distinct vendor_err codes (Reserved appears twice)");
        // 4 SGEs of 2^30 bytes: over 2^31.
        let huge = Sge { addr: 0, len: 1 << 30, lkey: 1 };
        let w = Wqe { num_sge: 4, sge0: huge, ..good };
        assert_eq!(w.decode(LIMITS, |_| huge), Err(WqeError::MessageTooLong(4 << 30)));
    }

    #[test]
    fn recv_wqe_round_trip_and_reserved() {
        let sgl = [sge(1), sge(2)];
        let r = RecvWqe::encode(11, &sgl);
        let (id, got) = r.decode(4, |k| sgl[k].into()).unwrap();
        assert_eq!((id, got.as_slice()), (11, &sgl[..]));
        let bad = RecvWqe { reserved: [0, 0, 1, 0, 0, 0, 0], ..r };
        assert_eq!(bad.decode(4, |_| Sge::default()), Err(WqeError::Reserved { field: "reserved", value: 1 << 16 }));
        let many = RecvWqe { num_sge: 5, ..r };
        assert_eq!(many.decode(4, |_| Sge::default()), Err(WqeError::TooManySge { num_sge: 5, max: 4 }));
    }

    #[test]
    fn cqe_round_trip() {
        let cases = [
            verbs::Cqe {
                wr_id: 1,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                qpn: 0x11,
                byte_len: 4096,
                imm: Some(7),
                invalidated_rkey: None,
                solicited: false,
            },
            verbs::Cqe {
                wr_id: 2,
                status: WcStatus::RemAccessErr,
                opcode: WcOpcode::RdmaRead,
                qpn: 0xffffff,
                byte_len: 0,
                imm: None,
                invalidated_rkey: None,
                solicited: false,
            },
            verbs::Cqe {
                wr_id: u64::MAX,
                status: WcStatus::FatalErr,
                opcode: WcOpcode::Recv,
                qpn: 3,
                byte_len: 1,
                imm: None,
                invalidated_rkey: Some(0x1234),
                solicited: false,
            },
        ];
        for c in cases {
            let shm = Cqe::from(&c);
            assert_eq!(shm.decode(), Ok(c));
        }
        assert_eq!(Cqe { status: 3, ..Cqe::default() }.decode(), Err(CqeError::Status(3)));
        assert_eq!(Cqe { opcode: 77, ..Cqe::default() }.decode(), Err(CqeError::Opcode(77)));
        let r = Cqe::refused(9, 0x11, WcOpcode::Send, &WqeError::UnknownOpcode(200));
        assert_eq!(r.decode().unwrap().status, WcStatus::LocQpOpErr);
        assert_eq!(r.vendor_err, 1);
    }

    #[test]
    fn region_layouts_pass_their_own_check() {
        for (sq, rq, ss, rs, inl) in
            [(1, 1, 1, 1, 0), (128, 512, 4, 4, 256), (1000, 3, 32, 0, 4096), (65536, 65536, 32, 32, 0)]
        {
            let h = RegionHeader::qp(sq, rq, ss, rs, inl).unwrap();
            h.check(region_kind::QP, h.region_len as usize).unwrap();
            assert!(h.sq.capacity >= sq && h.sq.capacity.is_power_of_two());
            assert_eq!(h.sq_sges.per_slot, u32::from(ss.saturating_sub(1)));
            assert_eq!(h.region_len % 4096, 0);
        }
        let h = RegionHeader::cq(100).unwrap();
        assert_eq!(h.sq.capacity, 128);
        h.check(region_kind::CQ, h.region_len as usize).unwrap();
        assert_eq!(RegionHeader::qp(1, 1, 33, 1, 0), Err(AbiError::BadSize("max_send_sge", 33)));
        assert!(RegionHeader::cq(u32::MAX).is_err());
    }

    #[test]
    fn cq_regions_have_a_checked_notification_block_and_arm_words_wrap() {
        let h = RegionHeader::cq(64).unwrap();
        let len = h.region_len as usize;
        assert!(h.notify >= h.sq.offset + 256 + 64 * 32 && h.notify.is_multiple_of(128), "{h:?}");
        assert_eq!(h.check(region_kind::CQ, len), Ok(()));
        let bad = |notify| RegionHeader { notify, ..h }.check(region_kind::CQ, len);
        assert_eq!(bad(0), Err(AbiError::Geometry("notification block offset")));
        assert_eq!(bad(h.notify + 8), Err(AbiError::Geometry("notification block offset")));
        assert_eq!(bad(h.sq.offset), Err(AbiError::Geometry("rings or tables overlap")));
        assert_eq!(bad(h.region_len), Err(AbiError::Geometry("a ring or table extends past region_len")));
        let q = RegionHeader::qp(4, 4, 1, 1, 0).unwrap();
        let ql = q.region_len as usize;
        assert_eq!(
            RegionHeader { notify: 128, ..q }.check(region_kind::QP, ql),
            Err(AbiError::Geometry("notification block in a QP region"))
        );
        assert_eq!(arm_word(5, true), 11);
        assert_eq!(arm_word(5, false), 10);
        assert_eq!(next_arm_seq(0), 1);
        assert_eq!(next_arm_seq(0x7fff_ffff), 1, "0 means never armed");
        assert_eq!(next_arm_seq(u32::MAX), 1);
    }

    #[test]
    fn region_check_rejects_bad_headers() {
        let h = RegionHeader::qp(64, 64, 4, 4, 128).unwrap();
        let len = h.region_len as usize;
        assert_eq!(RegionHeader { magic: 1, ..h }.check(region_kind::QP, len), Err(AbiError::BadMagic(1)));
        let v = RegionHeader { abi_version: 99, ..h }.check(region_kind::QP, len).unwrap_err();
        assert_eq!(v, AbiError::Version { daemon: 99, library: ABI_VERSION });
        assert!(v.to_string().contains("v99") && !v.to_string().contains('\n'));
        assert!(matches!(h.check(region_kind::CQ, len), Err(AbiError::Kind { .. })));
        assert!(matches!(h.check(region_kind::QP, len - 1), Err(AbiError::Geometry(_))));
        let overlap = RegionHeader { rq: RingDesc { offset: h.sq.offset, ..h.rq }, ..h };
        assert_eq!(overlap.check(region_kind::QP, len), Err(AbiError::Geometry("rings or tables overlap")));
        let past = RegionHeader { sq_inline: TableDesc { offset: h.region_len - 8, ..h.sq_inline }, ..h };
        assert!(matches!(past.check(region_kind::QP, len), Err(AbiError::Geometry(_))));
        let cap = RegionHeader { sq: RingDesc { capacity: 3, ..h.sq }, ..h };
        assert_eq!(cap.check(region_kind::QP, len), Err(AbiError::Geometry("ring capacity")));
    }
}
