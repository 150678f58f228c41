//! Reliable-connection queue pairs: the IB state machine, attributes, and the three roles that share one QP on one
//! worker: the requester (work requests -> packets), the completer (responses -> completions) and the responder
//! (requests -> execution and responses). Unlike rxe, the roles never run concurrently: the engine calls them one
//! at a time, so there are no locks or cross-role flags.

pub(crate) mod completer;
pub(crate) mod requester;
pub(crate) mod responder;
pub(crate) mod timer;

use crate::cc::{NotificationPoint, RateController};
use crate::mr::{AccessFlags, Pd};
pub use crate::stats::QpCounters;
use crate::time::{Duration, Instant};
use crate::verbs::{CqId, SendWr, Sge};
use crate::wire::{self, Ecn, IpAddrs, MacAddr, Psn, RoceRepr};
use core::fmt;
use std::collections::VecDeque;

pub(crate) use timer::{TimerKind, TimerTable};

/// QP states (IBA ch. 10; `enum ib_qp_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Reset: no traffic, queues empty.
    Reset,
    /// Initialised: receive WRs may be posted.
    Init,
    /// Ready to receive: the responder runs.
    Rtr,
    /// Ready to send: requester and completer run.
    Rts,
    /// Send queue drain: no new send WRs start; outstanding ones finish.
    Sqd,
    /// Send queue error (UC); kept for completeness, no new sends.
    Sqe,
    /// Error: everything outstanding is flushed; new WRs complete with WR_FLUSH_ERR.
    Err,
}

/// Path MTU values allowed by the IBA (bytes).
pub const PATH_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// RNR NAK timer table (IBTA encoding; µs). Code 0 means 655.36 ms.
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840, 5_120, 7_680,
    10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680, 491_520,
];

/// The peer of a connected QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerAddr {
    /// Peer IP (the GID: IPv4-mapped or IPv6).
    pub ip: IpAddrs,
    /// Peer (or next-hop) MAC.
    pub mac: MacAddr,
}

/// QP attributes for `modify_qp`. `None` leaves an attribute unchanged (the IB attribute mask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpAttr {
    /// Target state.
    pub state: Option<QpState>,
    /// Remote access rights granted to the peer (INIT).
    pub access: Option<AccessFlags>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (RTR).
    pub path_mtu: Option<u32>,
    /// Destination QP number (RTR).
    pub dest_qpn: Option<u32>,
    /// Expected PSN of the responder (RTR).
    pub rq_psn: Option<u32>,
    /// Max outstanding READ/atomic requests we accept (RTR).
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK timer code we send (RTR).
    pub min_rnr_timer: Option<u8>,
    /// Peer address (RTR).
    pub peer: Option<PeerAddr>,
    /// First PSN of the requester (RTS).
    pub sq_psn: Option<u32>,
    /// Local ACK timeout exponent: 4.096 µs * 2^t, 0 = infinite (RTS).
    pub timeout: Option<u8>,
    /// Transport retries (0..=7) (RTS).
    pub retry_cnt: Option<u8>,
    /// RNR retries (0..=7, 7 = infinite) (RTS).
    pub rnr_retry: Option<u8>,
    /// Max outstanding READ/atomic requests we issue (RTS).
    pub max_rd_atomic: Option<u8>,
    /// DSCP of transmitted frames.
    pub dscp: Option<u8>,
    /// ECN codepoint of the frames the QP sends (default ECT(0); CNPs are always Not-ECT).
    pub ecn: Option<Ecn>,
    /// IP TTL / hop limit.
    pub ttl: Option<u8>,
}

/// Queue sizes fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps { max_send_wr: 128, max_recv_wr: 512, max_send_sge: 4, max_recv_sge: 4, max_inline: 256 }
    }
}

/// Errors of the verbs control path (create, modify, post).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerbsError {
    /// No QP with this number.
    NoSuchQp(u32),
    /// No CQ with this id.
    NoSuchCq(u32),
    /// Too many QPs / CQs / MRs for this engine.
    ResourceExhausted(&'static str),
    /// The state transition is not allowed.
    BadTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A transition needs an attribute that was not given.
    MissingAttr(&'static str),
    /// An attribute value is out of range.
    BadAttr(&'static str, u64),
    /// An attribute the transition may not change (the connection's numbering and segmentation are fixed once
    /// packets can be in flight).
    AttrNotModifiable {
        /// The attribute.
        attr: &'static str,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// A queue size or SGE count exceeds the engine's limits.
    BadCaps(&'static str, u64),
    /// The queue is full.
    QueueFull,
    /// More SGEs than the QP allows.
    TooManySge(usize),
    /// Inline data longer than max_inline, or inline on an op without payload.
    BadInline(u64),
    /// A message longer than 2^31 bytes, or an atomic not of 8 bytes.
    BadLength(u64),
    /// The QP is not in a state that accepts this request.
    BadState(QpState),
    /// A memory region could not be registered.
    BadMr(&'static str),
    /// The object is still in use (a CQ that a QP completes into).
    InUse(&'static str),
}

impl fmt::Display for VerbsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerbsError::NoSuchQp(q) => write!(f, "no QP with number {q:#x}"),
            VerbsError::NoSuchCq(c) => write!(f, "no CQ with id {c}"),
            VerbsError::ResourceExhausted(what) => write!(f, "out of {what}"),
            VerbsError::BadTransition { from, to } => write!(f, "illegal QP transition {from:?} -> {to:?}"),
            VerbsError::MissingAttr(a) => write!(f, "missing QP attribute {a} for this transition"),
            VerbsError::BadAttr(a, v) => write!(f, "QP attribute {a} = {v} is out of range"),
            VerbsError::AttrNotModifiable { attr, from, to } => {
                write!(f, "QP attribute {attr} cannot be set in the transition {from:?} -> {to:?}")
            }
            VerbsError::BadCaps(a, v) => write!(f, "QP capability {a} = {v} exceeds the engine's limit"),
            VerbsError::QueueFull => f.write_str("work queue is full"),
            VerbsError::TooManySge(n) => write!(f, "{n} SGEs exceed the QP's max_sge"),
            VerbsError::BadInline(n) => write!(f, "inline data of {n} bytes not allowed here"),
            VerbsError::BadLength(n) => write!(f, "message length {n} not allowed for this operation"),
            VerbsError::BadState(s) => write!(f, "QP in state {s:?} cannot accept this request"),
            VerbsError::BadMr(why) => write!(f, "memory registration failed: {why}"),
            VerbsError::InUse(what) => write!(f, "{what} is still in use"),
        }
    }
}

impl std::error::Error for VerbsError {}

/// Where a send WQE stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WqeState {
    /// Posted, no packet sent yet (PSNs not assigned).
    Posted,
    /// PSNs assigned, at least one packet sent.
    Started,
}

/// A send work queue entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr: SendWr,
    pub(crate) num_sge: u32,
    /// Message length in bytes (8 for atomics).
    pub(crate) length: u64,
    pub(crate) state: WqeState,
    pub(crate) first_psn: Psn,
    pub(crate) last_psn: Psn,
    /// Counted in `outstanding_rd_atomic`.
    pub(crate) counted: bool,
}

/// A receive work queue entry.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) num_sge: u32,
    pub(crate) capacity: u64,
}

/// A ring of fixed slots with free-running u32 indices. The slot count is a power of two (indexing is a mask, not
/// a division); `cap` is the depth the application asked for, which bounds how many entries may be queued.
pub(crate) struct Ring<T> {
    pub(crate) slots: Vec<T>,
    mask: u32,
    cap: u32,
    pub(crate) head: u32,
    pub(crate) tail: u32,
}

impl<T: Copy> Ring<T> {
    fn new(depth: u32, fill: T) -> Ring<T> {
        let n = depth.max(1).next_power_of_two();
        Ring { slots: vec![fill; n as usize], mask: n - 1, cap: depth.max(1), head: 0, tail: 0 }
    }
    /// Number of slots (a power of two, >= the depth).
    #[inline]
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }
    #[inline]
    pub(crate) fn len(&self) -> u32 {
        self.tail.wrapping_sub(self.head)
    }
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.cap
    }
    #[inline]
    pub(crate) fn slot(&self, idx: u32) -> usize {
        (idx & self.mask) as usize
    }
    #[inline]
    pub(crate) fn get(&self, idx: u32) -> &T {
        &self.slots[self.slot(idx)]
    }
    #[inline]
    pub(crate) fn get_mut(&mut self, idx: u32) -> &mut T {
        let s = self.slot(idx);
        &mut self.slots[s]
    }
}

/// Outbound responder items, sent in order.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RespOut {
    /// ACK, NAK or RNR NAK.
    Ack { psn: Psn, syndrome: u8, msn: u32 },
    /// READ response packets `cur..=last`.
    Read { rkey: u32, va: u64, len: u64, first: Psn, start: Psn, cur: Psn, last: Psn, msn: u32 },
    /// Atomic ACK.
    AtomicAck { psn: Psn, orig: u64, msn: u32 },
}

/// Responder resources kept for duplicate READ / atomic requests (a ring of max_dest_rd_atomic entries).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Resource {
    Free,
    Read { rkey: u32, va: u64, len: u64, first: Psn, last: Psn, msn: u32 },
    Atomic { psn: Psn, orig: u64, msn: u32 },
}

/// The newest resource in the ring `slots` (next write at `next`) for which `f` gives a value, searched from the
/// most recently saved slot back: after the PSN space wraps, an old request at the same PSN may still hold a slot,
/// and a duplicate must be answered from the latest request with its PSN (ROCE-NOTES §1.6: replay the saved result).
pub(crate) fn newest_resource<T>(slots: &[Resource], next: usize, f: impl FnMut(&Resource) -> Option<T>) -> Option<T> {
    let (older, newer) = slots.split_at(next.min(slots.len()));
    newer.iter().chain(older).rev().find_map(f)
}

/// Receive-side message in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RespMsg {
    /// Between messages.
    Idle,
    /// Inside a multi-packet SEND: bytes received so far.
    Send { off: u64 },
    /// Inside a multi-packet WRITE.
    Write { rkey: u32, va: u64, resid: u64, total: u64 },
}

/// A reliable-connection QP.
pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) pd: Pd,
    pub(crate) state: QpState,
    pub(crate) send_cq: CqId,
    pub(crate) recv_cq: CqId,
    pub(crate) caps: QpCaps,

    // Attributes.
    pub(crate) access: AccessFlags,
    pub(crate) mtu: u32,
    pub(crate) dest_qpn: u32,
    pub(crate) timeout_exp: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) peer: Option<PeerAddr>,
    pub(crate) dscp: u8,
    pub(crate) ecn: Ecn,
    pub(crate) ttl: u8,
    /// Header template for every frame this QP sends (Ethernet, IP, UDP, BTH P_Key and dest QP).
    pub(crate) tmpl: RoceRepr,
    /// `tmpl`'s Ethernet/IP/UDP headers serialised once, patched per frame (the transmit fast path).
    pub(crate) hdr: wire::HeaderTemplate,

    // Send queue.
    pub(crate) sq: Ring<SendWqe>,
    pub(crate) sq_sges: Vec<Sge>,
    pub(crate) sq_inline: Vec<u8>,

    // Requester.
    /// Next PSN to transmit.
    pub(crate) req_psn: Psn,
    /// One past the highest PSN ever transmitted (retransmissions stay below it).
    pub(crate) req_max_psn: Psn,
    /// Index of the WQE the requester transmits from.
    pub(crate) req_cur: u32,
    /// Packets sent since the last AckReq.
    pub(crate) noack_pkts: u32,
    pub(crate) outstanding_rd_atomic: u32,
    /// No request may leave before this time (RNR back-off).
    pub(crate) rnr_until: Option<Instant>,

    // Completer.
    /// Oldest PSN not yet acknowledged.
    pub(crate) comp_psn: Psn,
    pub(crate) retry_left: u8,
    pub(crate) rnr_left: u8,
    /// comp_psn of the go-back-N in progress (None when none is).
    pub(crate) retry_at: Option<Psn>,

    // Responder.
    pub(crate) rq: Ring<RecvWqe>,
    pub(crate) rq_sges: Vec<Sge>,
    /// Expected PSN.
    pub(crate) resp_psn: Psn,
    pub(crate) msn: u32,
    pub(crate) sent_psn_nak: bool,
    pub(crate) resp_msg: RespMsg,
    pub(crate) resources: Vec<Resource>,
    pub(crate) res_next: usize,
    pub(crate) out: VecDeque<RespOut>,
    pub(crate) out_cap: usize,
    /// Coalesced ACK not yet queued: PSN, packets covered, and the MSN at that PSN (later messages, a READ or an
    /// atomic executed before the ACK leaves, must not be counted in it).
    pub(crate) pending_ack: Option<(Psn, u32, u32)>,

    pub(crate) timers: TimerTable,
    /// Reaction point and pacer (congestion control of what this QP sends).
    pub(crate) rc: RateController,
    /// Notification point (CNPs for CE-marked frames this QP receives).
    pub(crate) np: NotificationPoint,
    /// In the engine's ready queue.
    pub(crate) in_ready: bool,
    pub(crate) cnt: QpCounters,
}

/// Engine limits the QP caps are checked against.
pub(crate) const MAX_WR: u32 = 1 << 16;
pub(crate) const MAX_SGE: u32 = 32;
pub(crate) const MAX_INLINE: u32 = 4096;
pub(crate) const MAX_RD_ATOMIC: u8 = 128;
/// The largest message (IBA: 2^31 bytes).
pub const MAX_MSG_LEN: u64 = 1 << 31;

impl Qp {
    pub(crate) fn new(qpn: u32, pd: Pd, send_cq: CqId, recv_cq: CqId, caps: QpCaps) -> Result<Qp, VerbsError> {
        for (name, v, max) in [
            ("max_send_wr", caps.max_send_wr, MAX_WR),
            ("max_recv_wr", caps.max_recv_wr, MAX_WR),
            ("max_send_sge", caps.max_send_sge, MAX_SGE),
            ("max_recv_sge", caps.max_recv_sge, MAX_SGE),
            ("max_inline", caps.max_inline, MAX_INLINE),
        ] {
            if v > max {
                return Err(VerbsError::BadCaps(name, u64::from(v)));
            }
        }
        if caps.max_send_wr == 0 || caps.max_recv_wr == 0 {
            return Err(VerbsError::BadCaps("queue depth", 0));
        }
        let blank_wqe = SendWqe {
            wr: SendWr::new(0, crate::verbs::WrOpcode::Send),
            num_sge: 0,
            length: 0,
            state: WqeState::Posted,
            first_psn: Psn::new(0),
            last_psn: Psn::new(0),
            counted: false,
        };
        let sq = Ring::new(caps.max_send_wr, blank_wqe);
        let rq = Ring::new(caps.max_recv_wr, RecvWqe { wr_id: 0, num_sge: 0, capacity: 0 });
        let (sq_slots, rq_slots) = (sq.slot_count(), rq.slot_count());
        let tmpl = RoceRepr { udp_dst: wire::ROCE_UDP_PORT, ..RoceRepr::default() };
        Ok(Qp {
            qpn,
            pd,
            state: QpState::Reset,
            send_cq,
            recv_cq,
            caps,
            access: AccessFlags::NONE,
            mtu: 1024,
            dest_qpn: 0,
            timeout_exp: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            peer: None,
            dscp: 0,
            // ECN-capable by default so switches mark instead of dropping (rxe sends Not-ECT: ROCE-NOTES §1.9).
            ecn: Ecn::Ect0,
            ttl: 64,
            hdr: wire::HeaderTemplate::new(&tmpl),
            tmpl,
            sq,
            sq_sges: vec![Sge::default(); sq_slots * caps.max_send_sge.max(1) as usize],
            sq_inline: vec![0; sq_slots * caps.max_inline as usize],
            req_psn: Psn::new(0),
            req_max_psn: Psn::new(0),
            req_cur: 0,
            noack_pkts: 0,
            outstanding_rd_atomic: 0,
            rnr_until: None,
            comp_psn: Psn::new(0),
            retry_left: 7,
            rnr_left: 7,
            retry_at: None,
            rq,
            rq_sges: vec![Sge::default(); rq_slots * caps.max_recv_sge.max(1) as usize],
            resp_psn: Psn::new(0),
            msn: 0,
            sent_psn_nak: false,
            resp_msg: RespMsg::Idle,
            resources: vec![Resource::Free; 1],
            res_next: 0,
            out: VecDeque::new(),
            out_cap: 0,
            pending_ack: None,
            timers: TimerTable::default(),
            rc: RateController::LineRate,
            np: NotificationPoint::default(),
            in_ready: false,
            cnt: QpCounters::default(),
        })
    }

    /// The local ACK timeout, or None when infinite.
    pub(crate) fn ack_timeout(&self) -> Option<Duration> {
        if self.timeout_exp == 0 {
            None
        } else {
            Some(Duration::from_nanos(4096u64 << self.timeout_exp))
        }
    }

    /// True while the responder accepts requests.
    #[inline]
    pub(crate) fn responder_active(&self) -> bool {
        matches!(self.state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
    }

    /// True while the requester/completer run.
    #[inline]
    pub(crate) fn requester_active(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }

    /// Validates and applies a modify. `local` gives the engine's own addresses for the header template.
    pub(crate) fn modify(&mut self, a: &QpAttr, local_mac: MacAddr, local_ip: &LocalIp) -> Result<(), VerbsError> {
        use QpState::{Init, Reset, Rtr, Rts, Sqd, Sqe};
        let from = self.state;
        let to = a.state.unwrap_or(from);
        // IB QP state machine (ch. 10): any state may go to RESET or ERR; otherwise only these edges.
        let legal = matches!(
            (from, to),
            (_, Reset)
                | (_, QpState::Err)
                | (Reset, Init)
                | (Init, Init)
                | (Init, Rtr)
                | (Rtr, Rtr)
                | (Rtr, Rts)
                | (Rts, Rts)
                | (Rts, Sqd)
                | (Sqd, Rts)
                | (Sqd, Sqd)
                | (Sqe, Rts)
        );
        if !legal {
            return Err(VerbsError::BadTransition { from, to });
        }
        // Value checks first, so a failing modify changes nothing.
        if let Some(m) = a.path_mtu {
            if !PATH_MTUS.contains(&m) {
                return Err(VerbsError::BadAttr("path_mtu", u64::from(m)));
            }
        }
        let checks: [(&'static str, Option<u64>, u64); 10] = [
            ("dest_qpn", a.dest_qpn.map(u64::from), 0xff_ffff),
            ("rq_psn", a.rq_psn.map(u64::from), 0xff_ffff),
            ("sq_psn", a.sq_psn.map(u64::from), 0xff_ffff),
            ("timeout", a.timeout.map(u64::from), 31),
            ("retry_cnt", a.retry_cnt.map(u64::from), 7),
            ("rnr_retry", a.rnr_retry.map(u64::from), 7),
            ("min_rnr_timer", a.min_rnr_timer.map(u64::from), 31),
            ("max_rd_atomic", a.max_rd_atomic.map(u64::from), u64::from(MAX_RD_ATOMIC)),
            ("max_dest_rd_atomic", a.max_dest_rd_atomic.map(u64::from), u64::from(MAX_RD_ATOMIC)),
            ("dscp", a.dscp.map(u64::from), 63),
        ];
        for (name, v, max) in checks {
            if let Some(v) = v {
                if v > max {
                    return Err(VerbsError::BadAttr(name, v));
                }
            }
        }
        // The path MTU, the destination QP and the expected PSN are set on the way into RTR, the first send PSN on
        // RTR -> RTS, and never again (the IBA's modify-QP attribute table; Linux `ib_modify_qp_is_ok`): the send
        // queue's WQEs carry PSNs and message offsets computed from them, so changing one under a WR in flight
        // left that WR without a completion forever (sq_psn) or put a READ response past its message (path_mtu).
        let into_rtr = to == Rtr && matches!(from, Init | Rtr);
        for (attr, given, allowed) in [
            ("path_mtu", a.path_mtu.is_some(), into_rtr),
            ("dest_qpn", a.dest_qpn.is_some(), into_rtr),
            ("rq_psn", a.rq_psn.is_some(), into_rtr),
            ("sq_psn", a.sq_psn.is_some(), from == Rtr && to == Rts),
            // The responder's resource ring is sized on the way into RTR: given later it would be stored and ignored.
            ("max_dest_rd_atomic", a.max_dest_rd_atomic.is_some(), into_rtr),
        ] {
            if given && !allowed {
                return Err(VerbsError::AttrNotModifiable { attr, from, to });
            }
        }
        if let Some(p) = a.peer {
            match (p.ip, local_ip) {
                (IpAddrs::V4 { .. }, LocalIp { v4: None, .. }) => return Err(VerbsError::BadAttr("peer (IPv4)", 4)),
                (IpAddrs::V6 { .. }, LocalIp { v6: None, .. }) => return Err(VerbsError::BadAttr("peer (IPv6)", 6)),
                _ => {}
            }
        }
        if from == Init && to == Rtr {
            for (name, present) in [
                ("path_mtu", a.path_mtu.is_some()),
                ("dest_qpn", a.dest_qpn.is_some()),
                ("rq_psn", a.rq_psn.is_some()),
                ("peer", a.peer.is_some() || self.peer.is_some()),
            ] {
                if !present {
                    return Err(VerbsError::MissingAttr(name));
                }
            }
        }
        if from == Rtr && to == Rts && a.sq_psn.is_none() {
            return Err(VerbsError::MissingAttr("sq_psn"));
        }

        // Apply.
        if let Some(v) = a.access {
            self.access = v;
        }
        if let Some(v) = a.path_mtu {
            self.mtu = v;
        }
        if let Some(v) = a.dest_qpn {
            self.dest_qpn = v;
        }
        if let Some(v) = a.rq_psn {
            self.resp_psn = Psn::new(v);
        }
        if let Some(v) = a.max_dest_rd_atomic {
            // 0 is a real value: no responder resources, READ and atomic requests refused (rxe check_resource).
            self.max_dest_rd_atomic = v;
        }
        if let Some(v) = a.min_rnr_timer {
            self.min_rnr_timer = v;
        }
        if let Some(v) = a.peer {
            self.peer = Some(v);
        }
        if let Some(v) = a.sq_psn {
            let p = Psn::new(v);
            self.req_psn = p;
            self.req_max_psn = p;
            self.comp_psn = p;
        }
        if let Some(v) = a.timeout {
            self.timeout_exp = v;
        }
        if let Some(v) = a.retry_cnt {
            self.retry_cnt = v;
            self.retry_left = v;
        }
        if let Some(v) = a.rnr_retry {
            self.rnr_retry = v;
            self.rnr_left = v;
        }
        if let Some(v) = a.max_rd_atomic {
            self.max_rd_atomic = v.max(1);
        }
        if let Some(v) = a.dscp {
            self.dscp = v;
        }
        if let Some(v) = a.ecn {
            self.ecn = v;
        }
        if let Some(v) = a.ttl {
            self.ttl = v;
        }
        if to == Rtr && (from != Rtr || a.max_dest_rd_atomic.is_some()) {
            // (RTR -> RTR with a new max_dest_rd_atomic: the saved results go, so a duplicate of an earlier
            // READ/atomic is dropped, never executed twice; queued responses stay.)
            let n = usize::from(self.max_dest_rd_atomic);
            self.resources = vec![Resource::Free; n];
            self.res_next = 0;
            self.out_cap = 2 * n + 8;
            self.out.reserve(self.out_cap.saturating_sub(self.out.len()));
        }
        self.rebuild_template(local_mac, local_ip);
        match to {
            Reset => self.reset(),
            QpState::Err => self.state = QpState::Err,
            _ => self.state = to,
        }
        Ok(())
    }

    fn rebuild_template(&mut self, local_mac: MacAddr, local_ip: &LocalIp) {
        let t = &mut self.tmpl;
        t.eth.src = local_mac;
        t.ip.dscp = self.dscp;
        t.ip.ecn = self.ecn;
        t.ip.ttl = self.ttl;
        t.ip.dont_frag = true;
        t.bth.pkey = wire::DEFAULT_PKEY;
        t.bth.dest_qp = self.dest_qpn;
        t.udp_dst = wire::ROCE_UDP_PORT;
        t.udp_src = wire::rxe_udp_sport(self.qpn, self.dest_qpn);
        if let Some(p) = self.peer {
            t.eth.dst = p.mac;
            t.ip.addrs = match p.ip {
                IpAddrs::V4 { dst, .. } => IpAddrs::V4 { src: local_ip.v4.unwrap_or([0; 4]), dst },
                IpAddrs::V6 { dst, .. } => IpAddrs::V6 { src: local_ip.v6.unwrap_or([0; 16]), dst },
            };
        }
        self.hdr = wire::HeaderTemplate::new(&self.tmpl);
    }

    /// Back to RESET: queues emptied without completions (IB semantics), counters kept.
    fn reset(&mut self) {
        self.state = QpState::Reset;
        self.sq.head = 0;
        self.sq.tail = 0;
        self.rq.head = 0;
        self.rq.tail = 0;
        self.req_cur = 0;
        self.noack_pkts = 0;
        self.outstanding_rd_atomic = 0;
        self.rnr_until = None;
        // The retry counters restart (a QP that exhausted them and was reset keeps retry_cnt and rnr_retry when
        // the application does not give them again; it must not start its new life with none left).
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.retry_at = None;
        self.msn = 0;
        self.sent_psn_nak = false;
        self.resp_msg = RespMsg::Idle;
        self.out.clear();
        self.pending_ack = None;
        self.timers = TimerTable::default();
        self.rc.reset();
        self.np.reset();
        for r in &mut self.resources {
            *r = Resource::Free;
        }
    }

    /// True if the responder has a frame that may leave: an ACK-type item, or READ response data when the pacer
    /// does not hold the QP.
    #[inline]
    pub(crate) fn response_ready(&self, paced: bool) -> bool {
        match self.out.front() {
            Some(RespOut::Read { .. }) => !paced,
            Some(_) => true,
            None => false,
        }
    }

    /// Mirrors the rate controller's next event into the CC timer, moves a waiting pacer deadline to what the
    /// (possibly changed) rate gives now, and copies the decrease count into the counters.
    pub(crate) fn sync_cc(&mut self, now: Instant) {
        match self.rc.next_timer() {
            Some(t) => self.timers.set(TimerKind::Cc, t),
            None => self.timers.stop(TimerKind::Cc),
        }
        if self.timers.get(TimerKind::Pace).is_some() {
            self.timers.set(TimerKind::Pace, self.rc.earliest_departure(now).max(now));
        }
        self.cnt.rate_decreases = self.rc.rate_decreases();
    }

    /// The headers of a CNP to the peer QP (ROCE-NOTES §3.3): the QP's addresses and UDP ports, BTH opcode 0x81
    /// with BECN, P_Key 0xffff and PSN 0 (then 16 zero bytes and the ICRC), DSCP `np_cnp_dscp`, Not-ECT (a CNP is
    /// never marked), and 802.1p priority `np_cnp_prio` when the QP's frames carry a VLAN tag.
    pub(crate) fn cnp_repr(&self, cc: &crate::cc::CcConfig) -> RoceRepr {
        let mut r = self.tmpl;
        r.ip.dscp = cc.dcqcn.np_cnp_dscp & 0x3f;
        r.ip.ecn = Ecn::NotEct;
        if let Some(v) = r.eth.vlan.as_mut() {
            v.pcp = cc.dcqcn.np_cnp_prio & 7;
        }
        r.bth = wire::BthRepr::cnp(self.dest_qpn);
        r.ext = wire::ExtRepr::default();
        r
    }

    /// Offset of `psn` inside a WQE's message, in bytes.
    #[inline]
    pub(crate) fn psn_offset(&self, wqe: &SendWqe, psn: Psn) -> u64 {
        u64::from(psn.distance_from(wqe.first_psn)) * u64::from(self.mtu)
    }

    /// Packets a message of `len` bytes (at most [`MAX_MSG_LEN`]) takes at this MTU (at least one). The path MTU is
    /// a power of two ([`PATH_MTUS`]): a shift, not a division (a `div` per message on the transmit path).
    #[inline]
    pub(crate) fn npkts(&self, len: u64) -> u32 {
        debug_assert!(self.mtu.is_power_of_two());
        ((len + u64::from(self.mtu) - 1) >> self.mtu.trailing_zeros()).max(1) as u32
    }
}

/// The engine's own addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalIp {
    /// IPv4 address, if the port has one.
    pub v4: Option<[u8; 4]>,
    /// IPv6 address, if the port has one.
    pub v6: Option<[u8; 16]>,
}

#[cfg(test)]
mod tests {
    use super::{newest_resource, Psn, Resource};

    fn atomic(psn: u32, orig: u64) -> Resource {
        Resource::Atomic { psn: Psn::new(psn), orig, msn: 0 }
    }

    fn orig_at(slots: &[Resource], next: usize, psn: u32) -> Option<u64> {
        newest_resource(slots, next, |r| match *r {
            Resource::Atomic { psn: p, orig, .. } if p == Psn::new(psn) => Some(orig),
            _ => None,
        })
    }

    /// Two atomics at PSN 5, 2^24 PSNs apart, in a ring of four: wherever the ring's write index stands, a
    /// duplicate gets the result of the one saved last, whether it sits above or below the older one's slot.
    #[test]
    fn a_duplicate_is_answered_from_the_newest_request_with_its_psn() {
        // Saved in this order: (5, 100) then (9, 1), (7, 2), (5, 200); `next` is where the following save goes.
        let saves = [atomic(5, 100), atomic(9, 1), atomic(7, 2), atomic(5, 200)];
        for start in 0..4 {
            let mut slots = [Resource::Free; 4];
            let mut next = start;
            for r in saves {
                slots[next] = r;
                next = (next + 1) % 4;
            }
            assert_eq!(orig_at(&slots, next, 5), Some(200), "ring started at slot {start}");
            assert_eq!(orig_at(&slots, next, 9), Some(1));
            assert_eq!(orig_at(&slots, next, 6), None);
        }
        assert_eq!(orig_at(&[], 0, 5), None);
    }
}
