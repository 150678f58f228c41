//! The engine: many RC QPs behind one sans-IO interface.
//!
//! ```text
//! handle_rx(now, frame, meta)     frames in (byte slices; ECN is read from the IP header)
//! poll_transmit(now, buf)         one frame out, written into the caller's buffer (an mbuf's data room)
//! poll_timeout() / handle_timeout(now)
//! post_send / post_recv / poll_cq and the control verbs
//! ```
//! The engine never reads a clock, sleeps, allocates per packet or does I/O. Timers live in one min-heap with at
//! most one live entry per (QP, timer kind), so `poll_timeout` is O(1) and expiry O(log n). QPs with something to
//! send sit in a FIFO ready queue (round-robin), so `poll_transmit` never scans idle QPs.

use crate::cc::{CcConfig, CcState, RateController};
use crate::mr::{AccessFlags, MrKeys, MrSpan, MrTable, Pd};
use crate::qp::requester::ReqOutcome;
use crate::qp::{timer::NUM_TIMERS, LocalIp, Qp, QpAttr, QpCaps, QpState, RecvWqe, SendWqe, TimerTable, VerbsError};
use crate::qp::{PeerAddr, TimerKind, WqeState, MAX_MSG_LEN};
use crate::stats::{EngineStats, QpCounters};
use crate::time::{Duration, Instant};
use crate::verbs::{Cq, CqId, Cqe, SendWr, Sge};
use crate::wire::RxFrame;
use crate::wire::{self, op, AethRepr, AtomicEthRepr, Ecn, Error as WireError, IpAddrs, MacAddr, Psn, RethRepr};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// The responder's ACK-coalescing policy. The default ACKs every AckReq'd packet at once (as rxe does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckPolicy {
    /// Send the ACK once this many AckReq'd packets are waiting (>= 1).
    pub max_pkts: u32,
    /// Or once the first of them has waited this long (0 = at once).
    pub max_delay: Duration,
}

impl Default for AckPolicy {
    fn default() -> Self {
        AckPolicy { max_pkts: 1, max_delay: Duration::ZERO }
    }
}

/// Engine configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// The port's MAC.
    pub local_mac: MacAddr,
    /// The port's IP addresses (GIDs).
    pub local_ip: LocalIp,
    /// QP numbers start here (rxe's first QPN is 0x11).
    pub qpn_base: u32,
    /// Most QPs.
    pub max_qps: u32,
    /// Most CQs.
    pub max_cqs: u32,
    /// Most memory regions.
    pub max_mrs: u32,
    /// Requester window: most PSNs sent but not acknowledged per QP (rxe: 128). [`Engine::new`] keeps it within
    /// 1 ..= 2^23 (half the PSN space: beyond it PSN comparisons are ambiguous).
    pub max_unacked_psns: u32,
    /// Requester sets AckReq at least every this many packets inside a long message (rxe: 64). [`Engine::new`]
    /// lowers it to `max_unacked_psns`: a window that closes with no ACK requested would wait for the local ACK
    /// timeout.
    pub ack_req_every: u32,
    /// Responder ACK coalescing.
    pub ack: AckPolicy,
    /// Treat `retry_cnt = 7` as "retry forever", as Linux rxe does (ROCE-NOTES §1.4). Off by default: the IBA
    /// and ConnectX count 7 retries and then complete with RETRY_EXC_ERR; only `rnr_retry = 7` is infinite.
    pub retry_cnt_7_infinite: bool,
    /// Congestion control: the reaction point of every QP (line rate or DCQCN), the notification point (CNPs for
    /// CE-marked frames), and their parameters.
    pub cc: CcConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            local_mac: MacAddr([0x02, 0, 0, 0, 0, 1]),
            local_ip: LocalIp { v4: Some([10, 0, 0, 1]), v6: None },
            qpn_base: 0x11,
            max_qps: 1024,
            max_cqs: 1024,
            max_mrs: 4096,
            max_unacked_psns: 256,
            ack_req_every: 64,
            ack: AckPolicy::default(),
            retry_cnt_7_infinite: false,
            cc: CcConfig::default(),
        }
    }
}

/// Metadata of a received frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxMeta {
    /// Arrival port.
    pub port: u16,
    /// Arrival queue.
    pub queue: u16,
}

/// Where a packet's payload comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PayloadSrc {
    /// No payload.
    None,
    /// From send WQE `idx` at message offset `off` (SGL gather or inline copy).
    Sq { idx: u32, off: u64 },
    /// From a range of a local region checked as the packet was decided ([`MrTable::check_span`]): a READ
    /// response's, or the SGE of a SEND/WRITE that leaves whole in one packet.
    Span(MrSpan),
}

/// [`Engine::poll_transmit`]'s emit for a long payload, hashed for the ICRC as it is copied in
/// ([`HeaderTemplate::emit_with_fused`](wire::HeaderTemplate::emit_with_fused)); with whether the payload could be
/// read. Out of line and given the plan by value, so that the short frames' path keeps its locals in registers.
#[inline(never)]
fn emit_long(q: &Qp, mrs: &MrTable, buf: &mut [u8], plan: TxPlan, ident: u16) -> (Result<usize, WireError>, bool) {
    let mut ok = true;
    let ext = |info: &wire::OpInfo, tp: &mut [u8]| plan.ext.emit(info, tp);
    let res = q.hdr.emit_with_fused(buf, plan.bth, plan.payload_len as usize, ident, ext, |d, copy| {
        ok = fill_payload(plan.src, q, mrs, d, copy);
    });
    (res, ok)
}

/// Writes a packet's payload from `src` into `d` through `copy`; false if a request's payload could not be read
/// (zeros written instead). One body for both of [`Engine::poll_transmit`]'s emit calls, inlined into each.
#[inline(always)]
fn fill_payload(src: PayloadSrc, q: &Qp, mrs: &MrTable, d: &mut [u8], copy: &mut wire::PayloadCopy) -> bool {
    match src {
        PayloadSrc::None => {
            d.fill(0);
            true
        }
        PayloadSrc::Sq { idx, off } => q.gather(idx, off, d, mrs, copy),
        PayloadSrc::Span(span) => {
            if mrs.read_span(span, d, copy).is_err() {
                d.fill(0);
                return false;
            }
            true
        }
    }
}

/// The extension headers of a packet the engine sends, in the shapes the requester and responder produce (a few
/// words instead of an [`ExtRepr`](wire::ExtRepr) with a slot for every header).
#[derive(Clone, Copy, Debug)]
pub(crate) enum TxExt {
    /// BTH only.
    None,
    /// RETH (READ request, first packet of a WRITE), with immediate data on a WRITE_ONLY_WITH_IMMEDIATE.
    Reth(RethRepr, Option<u32>),
    /// Immediate data (last packet of a SEND/WRITE with immediate).
    Imm(u32),
    /// IETH (last packet of a SEND with invalidate).
    Ieth(u32),
    /// AtomicETH.
    Atomic(AtomicEthRepr),
    /// AETH (ACK, NAK, first and last READ response), with the original data of an atomic ACK.
    Aeth(AethRepr, Option<u64>),
}

impl TxExt {
    /// Writes the headers into `tp` (BTH start to payload) where the opcode table puts them. Everything after the
    /// BTH that they do not cover is zeroed, so a header the opcode needs but this value lacks goes out as zeros
    /// (as [`ExtRepr::emit`](wire::ExtRepr::emit) does); the requester and responder always give exactly the
    /// opcode's headers, which then cover every byte and the zeroing is skipped. Always inlined: both of
    /// [`Engine::poll_transmit`]'s emit calls take it.
    #[inline(always)]
    fn emit(&self, info: &wire::OpInfo, tp: &mut [u8]) -> Result<(), WireError> {
        let hdr = usize::from(info.hdr_len);
        let tp = tp.get_mut(..hdr).ok_or(WireError::BufferTooSmall)?;
        if self.write(info, tp) != hdr - wire::hdr_len::BTH {
            tp[wire::hdr_len::BTH..].fill(0);
            self.write(info, tp);
        }
        Ok(())
    }

    /// Writes the headers the opcode carries; returns how many bytes were written.
    #[inline(always)]
    fn write(&self, info: &wire::OpInfo, tp: &mut [u8]) -> usize {
        /// `bytes` at `off` if the opcode carries `flag` and they fit: their length, else 0.
        #[inline(always)]
        fn put<const N: usize>(info: &wire::OpInfo, tp: &mut [u8], flag: u32, off: u8, bytes: [u8; N]) -> usize {
            let off = usize::from(off);
            match tp.get_mut(off..off + N) {
                Some(d) if info.any(flag) => {
                    d.copy_from_slice(&bytes);
                    N
                }
                _ => 0,
            }
        }
        let o = &info.off;
        let imm = |tp: &mut [u8], v: Option<u32>| v.map_or(0, |v| put(info, tp, op::IMM_DT, o.imm_dt, v.to_be_bytes()));
        match *self {
            TxExt::None => 0,
            TxExt::Reth(r, v) => {
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&r.va.to_be_bytes());
                b[8..12].copy_from_slice(&r.rkey.to_be_bytes());
                b[12..].copy_from_slice(&r.len.to_be_bytes());
                put(info, tp, op::RETH, o.reth, b) + imm(tp, v)
            }
            TxExt::Imm(v) => imm(tp, Some(v)),
            TxExt::Ieth(v) => put(info, tp, op::IETH, o.ieth, v.to_be_bytes()),
            TxExt::Atomic(a) => {
                let mut b = [0u8; 28];
                b[..8].copy_from_slice(&a.va.to_be_bytes());
                b[8..12].copy_from_slice(&a.rkey.to_be_bytes());
                b[12..20].copy_from_slice(&a.swap_add.to_be_bytes());
                b[20..].copy_from_slice(&a.compare.to_be_bytes());
                put(info, tp, op::ATOMIC_ETH, o.atomic_eth, b)
            }
            TxExt::Aeth(a, orig) => {
                let aeth = ((u32::from(a.syndrome) << 24) | (a.msn & 0xff_ffff)).to_be_bytes();
                put(info, tp, op::AETH, o.aeth, aeth)
                    + orig.map_or(0, |v| put(info, tp, op::ATOMIC_ACK_ETH, o.atomic_ack_eth, v.to_be_bytes()))
            }
        }
    }
}

/// One packet decided by a QP role, before its bytes are written.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxPlan {
    pub(crate) bth: wire::TxBth,
    pub(crate) ext: TxExt,
    pub(crate) payload_len: u32,
    pub(crate) src: PayloadSrc,
    /// A data-bearing frame (request or READ response), as opposed to an ACK.
    #[allow(dead_code)]
    pub(crate) data_frame: bool,
}

/// What QP roles may touch besides their own QP.
pub(crate) struct Ctx<'a> {
    pub(crate) now: Instant,
    pub(crate) mrs: &'a mut MrTable,
    /// The engine's CQ table by the `Vec` itself (one pointer), not as a slice (pointer and length): the context is
    /// built per frame and stored for the out-of-line callees (WRITE 64 B: 1550.6 -> 1543.5 instructions a
    /// message, session 16).
    pub(crate) cqs: &'a mut Vec<Option<Cq>>,
    pub(crate) cfg: &'a EngineConfig,
}

impl Ctx<'_> {
    /// Pushes a completion; false if the CQ is missing or full.
    pub(crate) fn push_cqe(&mut self, cq: CqId, cqe: Cqe) -> bool {
        match self.cqs.get_mut(cq.0 as usize) {
            Some(Some(q)) => q.push(cqe),
            _ => false,
        }
    }
}

/// A snapshot of a QP for `query_qp`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: u32,
    /// State.
    pub state: QpState,
    /// Path MTU.
    pub path_mtu: u32,
    /// Destination QP.
    pub dest_qpn: u32,
    /// Next PSN the requester sends.
    pub sq_psn: u32,
    /// PSN the responder expects.
    pub rq_psn: u32,
    /// Send WRs outstanding.
    pub sq_outstanding: u32,
    /// Receive WRs posted.
    pub rq_posted: u32,
}

/// The next free slot of a send queue, for the source that [`Engine::post_sends_with`] calls to write a WR into it.
pub struct SendSlot<'a> {
    /// The slot's work request (stale until written: the source writes every field).
    pub wr: &'a mut SendWr,
    /// The slot's SGEs: room for the QP's `max_send_sge`.
    pub sges: &'a mut [Sge],
    /// The slot's inline area: the QP's `max_inline` bytes.
    pub inline: &'a mut [u8],
}

/// Why [`Engine::post_sends_with`] stopped before its count; the WR concerned was not posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostSendsStop<E> {
    /// The source failed.
    Source(E),
    /// The engine refused the WR the source wrote, as `post_send` would have.
    Refused {
        /// Its `wr_id`.
        wr_id: u64,
        /// Why.
        error: VerbsError,
    },
}

/// The RC engine.
pub struct Engine {
    cfg: EngineConfig,
    mrs: MrTable,
    cqs: Vec<Option<Cq>>,
    qps: Vec<Option<Box<Qp>>>,
    /// Where the search for the next free QP index starts: QP numbers are handed out cyclically over the range
    /// (as rxe does), so a destroyed QP's number comes back only after every other free one was used.
    next_qp: u32,
    next_pd: u32,
    heap: BinaryHeap<Reverse<(Instant, u32, u8)>>,
    ready: VecDeque<u32>,
    stats: EngineStats,
    ip_ident: u16,
}

/// QPN distance between the engines of two workers on one port: worker `w`'s engine numbers its QPs from
/// `qpn_base + w * QPN_STRIDE`, so the worker owning a frame's destination QP is a division ([`qpn_owner`]).
pub const QPN_STRIDE: u32 = 0x1_0000;

/// The worker owning `qpn` among `workers` workers whose engines start at `base + w * QPN_STRIDE`, if any.
#[inline]
pub fn qpn_owner(base: u32, workers: usize, qpn: u32) -> Option<usize> {
    let w = (qpn.checked_sub(base)? / QPN_STRIDE) as usize;
    (w < workers).then_some(w)
}

/// Bytes of headers around a payload, at most (Ethernet + VLAN, IPv6, UDP, BTH + largest extension, ICRC).
pub const MAX_HEADER_BYTES: usize = 18 + 40 + 8 + 12 + 28 + 4 + 4;

/// The longest frame whose ICRC [`Engine::handle_rx_mut`] checks in place: an untagged frame whose ICRC covers
/// under 128 bytes of IP packet, where crc32fast's serial kernel is slow and the in-place pass (8 more bytes: whole
/// blocks for a 64 B WRITE) takes its folding one. Longer frames are checked where they lie (`icrc::verify`): in
/// place, the pass starts with a load across the four bytes just written, and that stall costs more than it saves
/// (engine bench, alternated with the read-only check: WRITE 384 B -7%, 64 KiB -5%; session 15). On CPUs with
/// AVX-512 and VPCLMULQDQ both checks now run `crc::update_short` (session 21); the in-place pass still pays there
/// (64 B WRITE, 11 alternated pairs: the read-only check 0.96 of its rate; READ 64 B level in a noisy set).
const RX_IN_PLACE_MAX: usize = 14 + 127 + 4;

impl Engine {
    /// A new engine.
    pub fn new(cfg: EngineConfig) -> Engine {
        let max_qps = cfg.max_qps.min(0xff_ffff - cfg.qpn_base) as usize;
        // Only AckReq'd packets are acknowledged (ROCE-NOTES §1.5): with at most `max_unacked_psns` PSNs in flight,
        // one in every `max_unacked_psns` packets at least must ask for an ACK, or a long message stalls until the
        // local ACK timeout at every window.
        let max_unacked_psns = cfg.max_unacked_psns.clamp(1, 1 << 23);
        let ack_req_every = cfg.ack_req_every.min(max_unacked_psns);
        Engine {
            mrs: MrTable::new(cfg.max_mrs as usize),
            cqs: Vec::new(),
            qps: Vec::new(),
            next_qp: 0,
            next_pd: 1,
            heap: BinaryHeap::with_capacity(max_qps.min(4096) * NUM_TIMERS * 2),
            ready: VecDeque::with_capacity(max_qps.min(4096)),
            stats: EngineStats::default(),
            ip_ident: 0,
            cfg: EngineConfig { max_qps: max_qps as u32, max_unacked_psns, ack_req_every, ..cfg },
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Engine-level counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Sum of every QP's counters.
    pub fn qp_totals(&self) -> QpCounters {
        let mut t = QpCounters::default();
        for q in self.qps.iter().flatten() {
            t.add(&q.cnt);
        }
        t
    }

    // ---------------------------------------------------------------- control verbs

    /// Allocates a protection domain: the next number, wrapping after 2^32 - 1 (0 is never used). The engine does
    /// not track which PDs are alive: a caller that frees PDs and allocates billions (the daemon) skips numbers
    /// still in use.
    pub fn alloc_pd(&mut self) -> Pd {
        let pd = Pd(self.next_pd);
        self.next_pd = self.next_pd.wrapping_add(1).max(1);
        pd
    }

    /// Sets the next PD number [`alloc_pd`](Self::alloc_pd) returns (0 is taken as 1): for tests of the wrap.
    #[doc(hidden)]
    pub fn set_next_pd(&mut self, n: u32) {
        self.next_pd = n.max(1);
    }

    /// Registers a zero-filled region of `len` bytes at virtual address `va`.
    pub fn reg_mr(&mut self, pd: Pd, va: u64, len: usize, access: AccessFlags) -> Result<MrKeys, VerbsError> {
        self.mrs.register(pd, va, len, access).ok_or_else(|| mr_refusal(va, len as u64, "too many regions (max_mrs)"))
    }

    /// Registers a region whose bytes live in a client's shared memory (`mem`, mapped by the daemon) at the
    /// client's virtual address `va`.
    #[cfg(target_os = "linux")]
    pub fn reg_mr_shared(
        &mut self,
        pd: Pd,
        va: u64,
        mem: crate::ctrl::shm::ShmBytes,
        access: AccessFlags,
    ) -> Result<MrKeys, VerbsError> {
        let len = mem.len() as u64;
        self.mrs.register_shared(pd, va, mem, access).ok_or_else(|| mr_refusal(va, len, "too many regions (max_mrs)"))
    }

    /// [`reg_mr_shared`](Self::reg_mr_shared) under a key chosen elsewhere (another worker's engine registered the
    /// same region first): the key's slot must be free.
    #[cfg(target_os = "linux")]
    pub fn reg_mr_shared_at(
        &mut self,
        key: u32,
        pd: Pd,
        va: u64,
        mem: crate::ctrl::shm::ShmBytes,
        access: AccessFlags,
    ) -> Result<MrKeys, VerbsError> {
        let len = mem.len() as u64;
        self.mrs
            .register_shared_at(key, pd, va, mem, access)
            .ok_or_else(|| mr_refusal(va, len, "key in use or beyond max_mrs"))
    }

    /// Registered memory regions.
    pub fn mr_count(&self) -> usize {
        self.mrs.len()
    }

    /// Deregisters a region.
    pub fn dereg_mr(&mut self, lkey: u32) -> bool {
        self.mrs.deregister(lkey)
    }

    /// A region's bytes.
    pub fn mr_bytes(&self, lkey: u32) -> Option<&[u8]> {
        self.mrs.bytes(lkey)
    }

    /// A region's bytes, writable.
    pub fn mr_bytes_mut(&mut self, lkey: u32) -> Option<&mut [u8]> {
        self.mrs.bytes_mut(lkey)
    }

    /// Creates a completion queue of `depth` entries.
    pub fn create_cq(&mut self, depth: u32) -> Result<CqId, VerbsError> {
        if depth == 0 || depth > 1 << 20 {
            return Err(VerbsError::BadCaps("cq depth", u64::from(depth)));
        }
        if let Some(i) = self.cqs.iter().position(Option::is_none) {
            self.cqs[i] = Some(Cq::new(depth as usize));
            return Ok(CqId(i as u32));
        }
        if self.cqs.len() >= self.cfg.max_cqs as usize {
            return Err(VerbsError::ResourceExhausted("completion queues"));
        }
        self.cqs.push(Some(Cq::new(depth as usize)));
        Ok(CqId(self.cqs.len() as u32 - 1))
    }

    /// Destroys a completion queue (and the completions still in it). Fails while a QP still uses it.
    pub fn destroy_cq(&mut self, cq: CqId) -> Result<(), VerbsError> {
        if !matches!(self.cqs.get(cq.0 as usize), Some(Some(_))) {
            return Err(VerbsError::NoSuchCq(cq.0));
        }
        if self.qps.iter().flatten().any(|q| q.send_cq == cq || q.recv_cq == cq) {
            return Err(VerbsError::InUse("the completion queue (a queue pair completes into it)"));
        }
        self.cqs[cq.0 as usize] = None;
        Ok(())
    }

    /// Live QPs and CQs (for statistics and leak checks).
    pub fn counts(&self) -> (usize, usize) {
        (self.qps.iter().flatten().count(), self.cqs.iter().flatten().count())
    }

    /// Numbers of every live QP.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        let base = self.cfg.qpn_base;
        self.qps.iter().enumerate().filter(|(_, q)| q.is_some()).map(move |(i, _)| base + i as u32)
    }

    /// Polls up to `out.len()` completions; returns how many were written.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [Cqe]) -> usize {
        let Some(Some(q)) = self.cqs.get_mut(cq.0 as usize) else { return 0 };
        let mut n = 0;
        while n < out.len() {
            match q.pop() {
                Some(c) => {
                    out[n] = c;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// Removes the completions of QP `qpn` from CQ `cq` ([`destroy_qp`](Self::destroy_qp) does it for the QP's
    /// CQs); `removed` is told the position each had (0: the next to be polled), in order. Returns how many went.
    pub fn cq_clean(&mut self, cq: CqId, qpn: u32, removed: impl FnMut(usize)) -> usize {
        match self.cqs.get_mut(cq.0 as usize) {
            Some(Some(q)) => q.clean(qpn, removed),
            _ => 0,
        }
    }

    /// Polls one completion.
    pub fn poll_cq_one(&mut self, cq: CqId) -> Option<Cqe> {
        self.cqs.get_mut(cq.0 as usize)?.as_mut()?.pop()
    }

    /// The completions a CQ holds before it overflows (0 for no CQ).
    pub fn cq_depth(&self, cq: CqId) -> u32 {
        match self.cqs.get(cq.0 as usize) {
            Some(Some(q)) => u32::try_from(q.depth()).unwrap_or(u32::MAX),
            _ => 0,
        }
    }

    /// Sets how many completions a CQ holds before it overflows (at least 1; what it holds now stays).
    pub fn set_cq_depth(&mut self, cq: CqId, depth: u32) {
        if let Some(Some(q)) = self.cqs.get_mut(cq.0 as usize) {
            q.set_depth(depth.max(1) as usize);
        }
    }

    /// Completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqId) -> usize {
        match self.cqs.get(cq.0 as usize) {
            Some(Some(q)) => q.len(),
            _ => 0,
        }
    }

    /// Creates an RC QP in RESET; returns its QP number.
    pub fn create_qp(&mut self, pd: Pd, send_cq: CqId, recv_cq: CqId, caps: QpCaps) -> Result<u32, VerbsError> {
        for c in [send_cq, recv_cq] {
            if !matches!(self.cqs.get(c.0 as usize), Some(Some(_))) {
                return Err(VerbsError::NoSuchCq(c.0));
            }
        }
        let idx = self.free_qp_index().ok_or(VerbsError::ResourceExhausted("queue pairs"))?;
        let qpn = self.cfg.qpn_base + idx;
        let mut qp = Qp::new(qpn, pd, send_cq, recv_cq, caps)?;
        qp.rc = RateController::new(&self.cfg.cc);
        if idx as usize == self.qps.len() {
            self.qps.push(None);
        }
        self.qps[idx as usize] = Some(Box::new(qp));
        self.next_qp = if idx + 1 >= self.cfg.max_qps { 0 } else { idx + 1 };
        Ok(qpn)
    }

    /// The next free QP index at or after `next_qp`, wrapping over the range (`qps.len()` when a new slot is
    /// to be added): a destroyed QP's number is not handed out again while other numbers are free, so that what
    /// still names it (a peer's late packet, a completion an application kept) is not taken for a new QP's.
    fn free_qp_index(&self) -> Option<u32> {
        let n = self.qps.len();
        let from = (self.next_qp as usize).min(n);
        let i = match self.qps[from..].iter().position(Option::is_none) {
            Some(k) => from + k,
            None if n < self.cfg.max_qps as usize => n,
            None => self.qps[..from].iter().position(Option::is_none)?,
        };
        Some(i as u32)
    }

    #[inline]
    fn qp_index(&self, qpn: u32) -> Option<u32> {
        let i = qpn.checked_sub(self.cfg.qpn_base)?;
        matches!(self.qps.get(i as usize), Some(Some(_))).then_some(i)
    }

    fn qp_mut(&mut self, qpn: u32) -> Result<(u32, &mut Qp), VerbsError> {
        let i = self.qp_index(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        Ok((i, self.qps[i as usize].as_deref_mut().expect("checked")))
    }

    /// Modifies a QP (state transitions and attributes). Fails without changing anything on an illegal
    /// transition, a missing required attribute or an out-of-range value.
    pub fn modify_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<(), VerbsError> {
        let (mac, ip) = (self.cfg.local_mac, self.cfg.local_ip);
        let (i, qp) = self.qp_mut(qpn)?;
        let to_err = attr.state == Some(QpState::Err) && qp.state != QpState::Err;
        qp.modify(attr, mac, &ip)?;
        if to_err {
            // Moving to ERR flushes every outstanding WR.
            qp.state = QpState::Rts;
            let mut ctx = Ctx { now: Instant::ZERO, mrs: &mut self.mrs, cqs: &mut self.cqs, cfg: &self.cfg };
            let qp = self.qps[i as usize].as_deref_mut().expect("checked");
            qp.enter_error(&mut ctx);
        }
        self.sync_qp(i);
        // RESET and ERR stop every timer: drop their heap entries so poll_timeout reports no stale deadline.
        self.prune_timers();
        Ok(())
    }

    /// A snapshot of a QP.
    pub fn query_qp(&self, qpn: u32) -> Result<QpInfo, VerbsError> {
        let i = self.qp_index(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        let q = self.qps[i as usize].as_deref().expect("checked");
        Ok(QpInfo {
            qpn,
            state: q.state,
            path_mtu: q.mtu,
            dest_qpn: q.dest_qpn,
            sq_psn: q.req_psn.value(),
            rq_psn: q.resp_psn.value(),
            sq_outstanding: q.sq.len(),
            rq_posted: q.rq.len(),
        })
    }

    /// Send WRs outstanding and receive WRs posted on a QP (what [`query_qp`](Self::query_qp) reports as
    /// `sq_outstanding` and `rq_posted`, without the rest of the snapshot): the daemon's look before it moves WRs
    /// from a QP's shared rings.
    #[inline]
    pub fn wq_lens(&self, qpn: u32) -> Option<(u32, u32)> {
        let q = self.qps.get(qpn.checked_sub(self.cfg.qpn_base)? as usize)?.as_deref()?;
        Some((q.sq.len(), q.rq.len()))
    }

    /// A QP's rate control: the DCQCN state, or the line rate when congestion control is off.
    pub fn qp_cc_state(&self, qpn: u32) -> Option<CcState> {
        let i = self.qp_index(qpn)?;
        let q = self.qps[i as usize].as_deref()?;
        let line = u64::from(self.cfg.cc.line_rate_mbps) * 1000;
        Some(q.rc.state().unwrap_or(CcState { rate_kbps: line, target_kbps: line, alpha_q20: 0, limited: false }))
    }

    /// A QP's counters.
    pub fn qp_counters(&self, qpn: u32) -> Option<QpCounters> {
        let i = self.qp_index(qpn)?;
        Some(self.qps[i as usize].as_deref()?.cnt)
    }

    /// Destroys a QP (its outstanding WRs are dropped without completions, as ibv_destroy_qp does). The completions
    /// of the QP still in its CQs go too (as libmlx5's destroy cleans them out of the CQ buffers): none is polled
    /// after the destroy, when its number may name another QP.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let i = self.qp_index(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        let q = self.qps[i as usize].take().expect("checked");
        self.cq_clean(q.send_cq, qpn, |_| {});
        if q.recv_cq != q.send_cq {
            self.cq_clean(q.recv_cq, qpn, |_| {});
        }
        self.ready.retain(|&r| r != i);
        self.prune_timers();
        Ok(())
    }

    /// Posts a send work request with its scatter/gather list.
    // Inlinable into callers in other crates (rdp-nic, the engine bench): a caller that builds the WR just before
    // the call then has its fields stored straight into the WQE slot, not written to the stack and copied from there
    // (WRITE 64 B: 1633 -> 1575 instructions a message, session 16).
    #[inline]
    pub fn post_send(&mut self, qpn: u32, wr: &SendWr, sgl: &[Sge]) -> Result<(), VerbsError> {
        // One SGE (the common case) without the vectorised sum's set-up.
        let length: u64 = match sgl {
            [s] => u64::from(s.len),
            _ => sgl.iter().map(|s| u64::from(s.len)).sum(),
        };
        let i = self.check_post_send(qpn, wr, sgl.len(), length)?;
        let qp = self.qps[i as usize].as_deref_mut().expect("checked");
        let idx = qp.sq.tail;
        if wr.inline && length > 0 {
            // Inline data is copied now: the buffer may be reused as soon as post_send returns.
            let per = qp.caps.max_inline as usize;
            let base = qp.sq.slot(idx) * per;
            let mut at = base;
            for s in sgl {
                let dst = &mut qp.sq_inline[at..at + s.len as usize];
                self.mrs
                    .read(s.lkey, qp.pd, s.addr, dst, AccessFlags::NONE)
                    .map_err(|_| VerbsError::BadMr("inline SGE outside its region"))?;
                at += s.len as usize;
            }
        }
        let per = qp.caps.max_send_sge.max(1) as usize;
        let base = qp.sq.slot(idx) * per;
        // One SGE as one 16-byte move; `copy_from_slice` of a run of unknown length is a `memcpy` call.
        match (sgl, qp.sq_sges.get_mut(base)) {
            ([s], Some(d)) => *d = *s,
            _ => qp.sq_sges[base..base + sgl.len()].copy_from_slice(sgl),
        }
        push_send(qp, wr, sgl.len() as u32, length);
        if !wake_requester(qp, &mut self.ready, i) {
            self.flush_posted(i);
        }
        Ok(())
    }

    /// Posts a send work request whose payload is `data`, copied now into the QP's inline area (the bytes need not
    /// be in a registered region; the caller may reuse them at once). SEND and WRITE variants only, at most the
    /// QP's `max_inline` bytes. (The daemon's worker writes its clients' inline payloads straight into the slots
    /// instead: [`post_sends_with`](Self::post_sends_with).)
    pub fn post_send_inline(&mut self, qpn: u32, wr: &SendWr, data: &[u8]) -> Result<(), VerbsError> {
        let wr = SendWr { inline: true, ..*wr };
        let i = self.check_post_send(qpn, &wr, 0, data.len() as u64)?;
        let qp = self.qps[i as usize].as_deref_mut().expect("checked");
        let base = qp.sq.slot(qp.sq.tail) * qp.caps.max_inline as usize;
        // Cannot fail: data.len() <= max_inline (checked), and the area holds max_inline bytes per slot.
        if let Some(dst) = qp.sq_inline.get_mut(base..base + data.len()) {
            crate::copy::copy_bytes(dst, data);
        }
        push_send(qp, &wr, 0, data.len() as u64);
        if !wake_requester(qp, &mut self.ready, i) {
            self.flush_posted(i);
        }
        Ok(())
    }

    /// Posts up to `max` send work requests to QP `qpn`, each written by `fill` straight into the send queue's
    /// next free slot (no `SendWr` built elsewhere and copied in; one QP lookup, state check and requester wake-up
    /// for the batch): the daemon's worker decodes its clients' WQEs into the slots this way. `fill` gets the
    /// slot's WR (its previous contents are stale: write every field), room for the QP's `max_send_sge` SGEs and
    /// for its `max_inline` bytes, and returns `Ok(Some(n))` once it wrote a WR: `n` SGEs, or with `wr.inline`
    /// `n` bytes of inline payload; `Ok(None)` when it has no more. Each WR gets [`post_send`](Self::post_send)'s
    /// checks (the QP's state, SGE count, message length, inline limits), made on the slot after `fill` wrote it;
    /// a WR that fails them is not posted and ends the batch ([`PostSendsStop::Refused`] with its `wr_id`), as
    /// does an error of `fill` ([`PostSendsStop::Source`]). The batch also ends when the send queue is full, with
    /// no error (the source keeps the rest). Returns how many were posted, and why it stopped early if it did.
    /// `Err` only when there is no QP `qpn` (`fill` is not called).
    pub fn post_sends_with<E>(
        &mut self,
        qpn: u32,
        max: u32,
        mut fill: impl FnMut(SendSlot<'_>) -> Result<Option<u32>, E>,
    ) -> Result<(u32, Option<PostSendsStop<E>>), VerbsError> {
        let (i, qp) = qp_slot(&mut self.qps, self.cfg.qpn_base, qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        let not_ready = not_ready_to_send(qp.state);
        let caps = (qp.caps.max_send_sge, qp.caps.max_inline);
        let (per_sge, per_inline) = (caps.0.max(1) as usize, caps.1 as usize);
        let (mut posted, mut stop) = (0, None);
        while posted < max && !qp.sq.is_full() {
            let idx = qp.sq.tail;
            let s = qp.sq.slot(idx);
            let (sb, ib) = (s * per_sge, s * per_inline);
            let (Some(wqe), Some(sges), Some(inline)) = (
                qp.sq.slots.get_mut(s),
                qp.sq_sges.get_mut(sb..sb + per_sge),
                qp.sq_inline.get_mut(ib..ib + per_inline),
            ) else {
                break; // cannot happen: the tables hold every slot's share (Qp::new)
            };
            let n = match fill(SendSlot { wr: &mut wqe.wr, sges: &mut sges[..], inline: &mut inline[..] }) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => {
                    stop = Some(PostSendsStop::Source(e));
                    break;
                }
            };
            // post_send's checks (check_send_wr, the same function in the same order), on what `fill` wrote:
            // inline, `n` bytes and no SGE; else `n` SGEs (a count past the room fails as TooManySge before its
            // length is looked at). Called in each branch, so that the check's own `inline` test folds away.
            let wr = &wqe.wr;
            let checked = if wr.inline {
                let length = u64::from(n);
                check_send_wr(not_ready, caps, wr, 0, length).map(|()| (0, length))
            } else {
                let length = match sges.get(..n as usize) {
                    // One SGE (the common case) without the vectorised sum's set-up.
                    Some([one]) => u64::from(one.len),
                    Some(list) => list.iter().map(|s| u64::from(s.len)).sum(),
                    None => 0,
                };
                check_send_wr(not_ready, caps, wr, n as usize, length).map(|()| (n, length))
            };
            let (num_sge, length) = match checked {
                Ok(v) => v,
                Err(error) => {
                    stop = Some(PostSendsStop::Refused { wr_id: wr.wr_id, error });
                    break;
                }
            };
            wqe.num_sge = num_sge;
            wqe.length = length;
            wqe.state = WqeState::Posted;
            wqe.first_psn = Psn::new(0);
            wqe.last_psn = Psn::new(0);
            wqe.counted = false;
            qp.sq.tail = idx.wrapping_add(1);
            posted += 1;
        }
        if posted > 0 && !wake_requester(qp, &mut self.ready, i) {
            self.flush_posted(i);
        }
        Ok((posted, stop))
    }

    /// The checks of a send post ([`check_send_wr`]) and room in the send queue. Returns the QP's index.
    fn check_post_send(&self, qpn: u32, wr: &SendWr, num_sge: usize, length: u64) -> Result<u32, VerbsError> {
        let i = self.qp_index(qpn).ok_or(VerbsError::NoSuchQp(qpn))?;
        let qp = self.qps[i as usize].as_deref().expect("checked");
        let caps = (qp.caps.max_send_sge, qp.caps.max_inline);
        check_send_wr(not_ready_to_send(qp.state), caps, wr, num_sge, length)?;
        if qp.sq.is_full() {
            return Err(VerbsError::QueueFull);
        }
        Ok(i)
    }

    /// A send WQE posted to QP `i` in the error state: it completes flushed ([`wake_requester`] refused it).
    #[cold]
    #[inline(never)]
    fn flush_posted(&mut self, i: u32) {
        let mut ctx = Ctx { now: Instant::ZERO, mrs: &mut self.mrs, cqs: &mut self.cqs, cfg: &self.cfg };
        let qp = self.qps[i as usize].as_deref_mut().expect("checked");
        qp.enter_error(&mut ctx);
        self.sync_qp(i);
    }

    /// Posts a receive work request.
    pub fn post_recv(&mut self, qpn: u32, wr_id: u64, sgl: &[Sge]) -> Result<(), VerbsError> {
        let (i, qp) = self.qp_mut(qpn)?;
        if qp.state == QpState::Reset {
            return Err(VerbsError::BadState(qp.state));
        }
        if sgl.len() > qp.caps.max_recv_sge as usize {
            return Err(VerbsError::TooManySge(sgl.len()));
        }
        if qp.rq.is_full() {
            return Err(VerbsError::QueueFull);
        }
        let capacity: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
        let idx = qp.rq.tail;
        let per = qp.caps.max_recv_sge.max(1) as usize;
        let base = qp.rq.slot(idx) * per;
        qp.rq_sges[base..base + sgl.len()].copy_from_slice(sgl);
        *qp.rq.get_mut(idx) = RecvWqe { wr_id, num_sge: sgl.len() as u32, capacity };
        qp.rq.tail = idx.wrapping_add(1);
        if qp.state == QpState::Err {
            let mut ctx = Ctx { now: Instant::ZERO, mrs: &mut self.mrs, cqs: &mut self.cqs, cfg: &self.cfg };
            let qp = self.qps[i as usize].as_deref_mut().expect("checked");
            qp.flush_rq(&mut ctx);
        }
        Ok(())
    }

    // ---------------------------------------------------------------- the sans-IO interface

    /// Handles one received Ethernet frame. Anything malformed, unknown or unexpected is counted and dropped; the
    /// engine never panics on frame contents. A caller that owns the frame's buffer should prefer
    /// [`handle_rx_mut`](Self::handle_rx_mut) (same effect, a cheaper ICRC check).
    pub fn handle_rx(&mut self, now: Instant, frame: &[u8], meta: RxMeta) {
        self.rx(now, frame, None, meta);
    }

    /// [`handle_rx`](Self::handle_rx) of a frame in a buffer the caller owns (an mbuf after its rx burst, a queued
    /// `Vec`): the same effect, with the ICRC checked in place ([`wire::icrc::rx_prepare`]: four bytes of the
    /// Ethernet source address are overwritten for the pass, which no check of the frame reads, and put back before
    /// this returns). The frame's bytes are as received when it returns, whatever the frame holds.
    pub fn handle_rx_mut(&mut self, now: Instant, frame: &mut [u8], meta: RxMeta) {
        // The length test alone here, both calls last: the preparation's register saves and stack frame are in
        // `rx_in_place`, which a longer frame does not pay (they came before the length test when this function
        // held the preparation: WRITE 384 B 2139 -> 2122 instructions a message, session 16).
        if frame.len() <= RX_IN_PLACE_MAX {
            self.rx_in_place(now, frame, meta)
        } else {
            self.rx(now, frame, None, meta)
        }
    }

    /// [`handle_rx_mut`](Self::handle_rx_mut) of a frame short enough for the in-place ICRC pass.
    #[inline(never)]
    fn rx_in_place(&mut self, now: Instant, frame: &mut [u8], meta: RxMeta) {
        let prep = wire::icrc::rx_prepare(frame);
        self.rx(now, frame, prep.as_ref(), meta);
        if let Some(p) = prep {
            wire::icrc::rx_restore(frame, p);
        }
    }

    /// [`handle_rx`](Self::handle_rx) of a frame that `prep` (if any) prepared for the in-place ICRC check. Out of
    /// line: one copy for both entry points, and the bytes to put back stay in the caller's registers, not live
    /// (spilled) across the whole frame's handling.
    #[inline(never)]
    fn rx(&mut self, now: Instant, frame: &[u8], prep: Option<&wire::icrc::RxPrepared>, _meta: RxMeta) {
        self.stats.rx_frames += 1;
        // A prepared frame is untagged (`rx_prepare` takes only EtherType IPv4 or IPv6 at offset 12).
        if prep.is_none() && vlan_id(frame).is_some_and(|vid| vid != 0) {
            // Tagged for a VLAN: a frame of another network, as for ARP/ND (neigh.rs). The port has no VLAN and every
            // QP sends untagged, so no QP's peer is there (and an answer would leave on the untagged network). A
            // priority tag (VID 0, IEEE 802.1Q: priority only, no VLAN) is the untagged network's and is taken.
            self.stats.rx_drop_vlan += 1;
            return;
        }
        // Moved out of the Result, not borrowed in it: stored for the out-of-line callees after the ICRC's check.
        let parsed = wire::parse_rx_own(frame, prep);
        let f = match parsed {
            Ok(f) => f,
            Err(e) => {
                self.count_parse_error(e);
                return;
            }
        };
        let f = &f;
        let ip = f.ip();
        let bth = f.bth();
        let for_us = match ip.addrs {
            wire::IpAddrs::V4 { dst, .. } => self.cfg.local_ip.v4 == Some(dst),
            wire::IpAddrs::V6 { dst, .. } => self.cfg.local_ip.v6 == Some(dst),
        };
        if !for_us {
            self.stats.rx_drop_not_for_us += 1;
            return;
        }
        let flags = bth.opcode.flags();
        if flags & op::CNP != 0 {
            self.stats.rx_cnp += 1;
            self.handle_cnp(now, f);
            return;
        }
        if flags & op::RC == 0 {
            self.stats.rx_drop_wrong_transport += 1;
            return;
        }
        // One lookup for the whole frame (the QP table is borrowed alone, beside the heap and the ready queue).
        let Some((i, qp)) = qp_slot(&mut self.qps, self.cfg.qpn_base, bth.dest_qp) else {
            self.stats.rx_drop_unknown_qp += 1;
            return;
        };
        if matches!(qp.state, QpState::Reset | QpState::Init) {
            self.stats.rx_drop_bad_state += 1;
            return;
        }
        if !from_peer(qp.peer, ip.addrs) {
            self.stats.rx_drop_wrong_peer += 1;
            return;
        }
        if ip.ecn == Ecn::Ce {
            // DCQCN notification point: a CE-marked frame asks for a CNP to the peer QP, at most one per interval.
            qp.cnt.ecn_ce_rcvd += 1;
            let iv = Duration::from_micros(u64::from(self.cfg.cc.dcqcn.np_min_time_between_cnps));
            // A QP in ERR drops the frame (below) and sends no CNP for it.
            if !(self.cfg.cc.np_enabled && qp.state != QpState::Err && qp.np.on_ce(now, iv)) {
                qp.cnt.cnp_suppressed += 1;
            }
        }
        let mut ctx = Ctx { now, mrs: &mut self.mrs, cqs: &mut self.cqs, cfg: &self.cfg };
        if flags & op::REQ != 0 {
            qp.handle_request(&mut ctx, f);
        } else {
            qp.handle_response(&mut ctx, f);
        }
        // sync_qp without looking the QP up again.
        sync_timers_of(&mut self.heap, qp, i);
        enqueue_ready(qp, &mut self.ready, i);
        self.prune_timers();
    }

    /// A CNP: its destination QP is ours, the QP whose frames were marked. The reaction point acts on it.
    fn handle_cnp(&mut self, now: Instant, f: &RxFrame<'_>) {
        let Some(i) = self.qp_index(f.bth().dest_qp) else {
            self.stats.rx_cnp_ignored += 1;
            return;
        };
        let qp = self.qps[i as usize].as_deref_mut().expect("checked");
        // A QP in ERR sends no data frame: a CNP has nothing to slow, and acting on it would arm the CC timer the
        // error state stopped.
        if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Err) || !from_peer(qp.peer, f.ip().addrs) {
            self.stats.rx_cnp_ignored += 1;
            return;
        }
        if qp.rc.on_cnp(now) {
            qp.cnt.cnp_rcvd += 1;
            qp.sync_cc(now);
            self.sync_timers(i);
            self.prune_timers();
        } else {
            qp.cnt.cnp_ignored += 1;
            self.stats.rx_cnp_ignored += 1;
        }
    }

    fn count_parse_error(&mut self, e: WireError) {
        let s = &mut self.stats;
        match e {
            WireError::Truncated => s.rx_drop_truncated += 1,
            WireError::NotIp => s.rx_drop_not_ip += 1,
            WireError::BadIpHeader => s.rx_drop_bad_ip_header += 1,
            WireError::NotUdp => s.rx_drop_not_udp += 1,
            WireError::NotRoce => s.rx_drop_not_roce += 1,
            WireError::LengthMismatch => s.rx_drop_length_mismatch += 1,
            WireError::BadBthVersion => s.rx_drop_bad_bth_version += 1,
            WireError::UnknownOpcode(_) => s.rx_drop_unknown_opcode += 1,
            WireError::BadPadCount => s.rx_drop_bad_pad += 1,
            WireError::BadIcrc => s.rx_drop_icrc += 1,
            WireError::BufferTooSmall | WireError::Unencodable => s.rx_drop_truncated += 1,
        }
    }

    /// True if some QP may have a frame to send (`poll_transmit` would try).
    pub fn has_pending_tx(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Writes the next frame into `buf` and returns its length, or None if nothing is ready to send. `buf` must
    /// hold the QP's path MTU plus [`MAX_HEADER_BYTES`].
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<usize> {
        // The QP at the front stays there (`in_ready`) while it is served; `requeue_front` then takes it out, moves
        // it to the back behind other ready QPs (round robin), or leaves it when it is the only one (no pop and
        // push per frame). A blocked QP leaves the queue until an input wakes it (`unqueue_front`).
        while let Some(&i) = self.ready.front() {
            let Some(qp) = self.qps.get_mut(i as usize).and_then(|q| q.as_deref_mut()) else {
                self.ready.pop_front();
                continue;
            };
            if buf.len() < qp.mtu as usize + MAX_HEADER_BYTES {
                self.stats.tx_buffer_too_small += 1;
                self.requeue_front(i);
                return None;
            }
            if qp.np.pending() {
                // A CNP leaves ahead of everything else of the QP, unpaced (CNPs go to the highest priority).
                qp.np.sent();
                let repr = qp.cnp_repr(&self.cfg.cc);
                return self.emit_cnp(i, repr, buf);
            }
            // Pacing: data frames (requests, READ responses) wait for the rate controller; ACKs do not.
            let pace_at = qp.rc.earliest_departure(now);
            let paced = pace_at > now;
            let mut ctx = Ctx { now, mrs: &mut self.mrs, cqs: &mut self.cqs, cfg: &self.cfg };
            let response = if qp.response_ready(paced) { qp.next_response(&mut ctx) } else { None };
            let plan = match response {
                Some(p) => p,
                None if paced => {
                    qp.timers.set(TimerKind::Pace, pace_at);
                    // Blocked: the QP leaves the ready queue until an input (a response, a post, a timer) wakes
                    // it. Re-queueing it here would spin.
                    self.unqueue_front(i);
                    continue;
                }
                None => match qp.next_request(&mut ctx) {
                    ReqOutcome::Packet(p) => p,
                    ReqOutcome::LocalError(st) => {
                        // The WQE the requester was about to start failed local checks: it completes with the
                        // error, any earlier WQE still in flight is flushed, and the QP enters the error state (IB:
                        // a local protection error is fatal to the QP).
                        let bad = qp.req_cur;
                        qp.fail_local(&mut ctx, bad, st);
                        self.unqueue_front(i);
                        continue;
                    }
                    // Blocked (window, max_rd_atomic, fence, RNR) or empty: as above.
                    ReqOutcome::Idle => {
                        self.unqueue_front(i);
                        continue;
                    }
                },
            };
            let plan = &plan;
            self.ip_ident = self.ip_ident.wrapping_add(1);
            let ident = self.ip_ident;
            let mrs = &self.mrs;
            let q: &Qp = qp;
            let len = plan.payload_len as usize;
            let mut bad = false;
            // One call with one payload closure (not one per source): the header code is inlined once, and the
            // closures with it. A long payload is hashed for the ICRC as it is copied in (out of line).
            let res = if len >= wire::template::FUSED_FROM {
                let (r, ok) = emit_long(q, mrs, buf, *plan, ident);
                bad = !ok;
                r
            } else {
                let ext = |info: &wire::OpInfo, tp: &mut [u8]| plan.ext.emit(info, tp);
                q.hdr.emit_with(buf, plan.bth, len, ident, ext, |d| {
                    bad = !fill_payload(plan.src, q, mrs, d, &mut wire::PayloadCopy::plain());
                })
            };
            if bad {
                qp.cnt.tx_local_access_errors += 1;
                // A request's payload could not be read: its region was deregistered (or invalidated) under the
                // in-flight WR. Zeros must not leave as the message's data (the peer would place them and the WR
                // complete with success): the frame is not sent, the WR completes with LOC_PROT_ERR and the QP
                // enters ERR, as when a READ response cannot be placed (completer) and as rxe fails such a WQE.
                // (A `Span` was checked in this same call: its read cannot fail.)
                if let PayloadSrc::Sq { idx, .. } = plan.src {
                    let mut ctx = Ctx { now, mrs: &mut self.mrs, cqs: &mut self.cqs, cfg: &self.cfg };
                    qp.fail_local(&mut ctx, idx, crate::verbs::WcStatus::LocProtErr);
                    self.unqueue_front(i);
                    continue;
                }
            }
            if let (Ok(n), true) = (res, plan.data_frame) {
                // Without an active limiter a sent frame changes nothing in the rate controller (no pacing, no
                // byte counter, no timer): DCQCN on without congestion costs what congestion control off does.
                if qp.rc.limited() {
                    qp.rc.on_sent(now, n);
                    qp.sync_cc(now);
                }
            }
            match res {
                Ok(n) => {
                    qp.cnt.tx_packets += 1;
                    qp.cnt.tx_bytes += n as u64;
                    self.stats.tx_frames += 1;
                    self.stats.tx_bytes += n as u64;
                    requeue(&mut self.ready, &mut self.heap, qp, i);
                    return Some(n);
                }
                Err(_) => {
                    self.stats.tx_emit_errors += 1;
                    self.requeue_front(i);
                    continue;
                }
            }
        }
        None
    }

    /// Writes the CNP of QP `i` into `buf`.
    fn emit_cnp(&mut self, i: u32, mut repr: wire::RoceRepr, buf: &mut [u8]) -> Option<usize> {
        self.ip_ident = self.ip_ident.wrapping_add(1);
        repr.ip.ident = self.ip_ident;
        let res = wire::emit_frame(buf, &repr, 0, |_| {});
        self.requeue_front(i);
        let Ok(n) = res else {
            self.stats.tx_emit_errors += 1;
            return None;
        };
        let qp = self.qps[i as usize].as_deref_mut().expect("present");
        qp.cnt.cnp_sent += 1;
        qp.cnt.tx_packets += 1;
        qp.cnt.tx_bytes += n as u64;
        self.stats.tx_frames += 1;
        self.stats.tx_bytes += n as u64;
        Some(n)
    }

    /// The earliest time `handle_timeout` has work (may be early: a spurious call is a no-op).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Runs every timer that expired at or before `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((t, i, k))) = self.heap.peek() {
            if t > now {
                break;
            }
            self.heap.pop();
            let Some(qp) = self.qps.get_mut(i as usize).and_then(|q| q.as_deref_mut()) else { continue };
            let ku = k as usize;
            if qp.timers.queued[ku] != Some(t) {
                continue; // superseded entry
            }
            qp.timers.queued[ku] = None;
            match qp.timers.deadline[ku] {
                None => continue,
                Some(d) if d > now => {
                    // Re-armed later since this entry was queued.
                    qp.timers.queued[ku] = Some(d);
                    self.heap.push(Reverse((d, i, k)));
                    continue;
                }
                Some(_) => qp.timers.stop(TimerTable::kind(ku)),
            }
            self.stats.timer_expiries += 1;
            let mut ctx = Ctx { now, mrs: &mut self.mrs, cqs: &mut self.cqs, cfg: &self.cfg };
            match TimerTable::kind(ku) {
                TimerKind::Retransmit => qp.on_retransmit_timeout(&mut ctx),
                TimerKind::Rnr => qp.rnr_until = None,
                TimerKind::AckCoalesce => qp.flush_pending_ack(),
                TimerKind::Cc => {
                    qp.rc.on_timer(now);
                    qp.sync_cc(now);
                }
                TimerKind::Pace => {} // the QP may send again: sync_qp puts it back in the ready queue
            }
            self.sync_qp(i);
        }
        self.prune_timers();
    }

    /// Drops superseded or stopped entries from the top of the heap so `poll_timeout` is exact after a call. Only
    /// the check of the top entry is inline (it is live after most frames): the loop's register saves, paid on
    /// every call when it was one function, cost more than the check.
    #[inline(always)]
    fn prune_timers(&mut self) {
        if self.top_timer_stale() {
            self.prune_stale_timers();
        }
    }

    /// True if the heap's first entry is superseded or stopped (or its QP is gone).
    #[inline(always)]
    fn top_timer_stale(&self) -> bool {
        let Some(&Reverse((t, i, k))) = self.heap.peek() else { return false };
        match self.qps.get(i as usize).and_then(|q| q.as_deref()) {
            Some(qp) => qp.timers.queued[k as usize] != Some(t) || qp.timers.deadline[k as usize].is_none(),
            None => true,
        }
    }

    /// Pops stale entries off the heap's top, putting back the entry of a timer re-armed meanwhile.
    #[inline(never)]
    fn prune_stale_timers(&mut self) {
        while self.top_timer_stale() {
            let Some(Reverse((t, i, k))) = self.heap.pop() else { return };
            if let Some(qp) = self.qps.get_mut(i as usize).and_then(|q| q.as_deref_mut()) {
                if qp.timers.queued[k as usize] == Some(t) {
                    qp.timers.queued[k as usize] = None;
                    // A stopped timer that was re-armed meanwhile needs its entry back.
                    if let Some(d) = qp.timers.deadline[k as usize] {
                        qp.timers.queued[k as usize] = Some(d);
                        self.heap.push(Reverse((d, i, k)));
                    }
                }
            }
        }
    }

    /// Mirrors a QP's timers into the heap and puts it in the ready queue if it has something to send. Inline, as
    /// its two parts are: called once per frame, it mostly finds nothing to do, and out of line it paid six
    /// register saves and restores for that.
    #[inline(always)]
    fn sync_qp(&mut self, i: u32) {
        self.sync_timers(i);
        self.mark_ready(i);
    }

    /// Puts a QP in the ready queue if it has something to send and is not there yet.
    #[inline(always)]
    fn mark_ready(&mut self, i: u32) {
        let Some(qp) = self.qps.get_mut(i as usize).and_then(|q| q.as_deref_mut()) else { return };
        enqueue_ready(qp, &mut self.ready, i);
    }

    /// After `poll_transmit` served QP `i` at the front of the ready queue: its timers go to the heap, and it leaves
    /// the queue if it has nothing more to send, goes to the back if other QPs wait, or stays at the front.
    #[inline(always)]
    fn requeue_front(&mut self, i: u32) {
        match self.qps.get_mut(i as usize).and_then(|q| q.as_deref_mut()) {
            Some(qp) => requeue(&mut self.ready, &mut self.heap, qp, i),
            None => {
                self.ready.pop_front();
            }
        }
    }

    /// `poll_transmit` found QP `i` (at the front of the ready queue) blocked or failed: it leaves the queue until an
    /// input wakes it, its timers go to the heap.
    #[inline(always)]
    fn unqueue_front(&mut self, i: u32) {
        self.ready.pop_front();
        if let Some(qp) = self.qps.get_mut(i as usize).and_then(|q| q.as_deref_mut()) {
            qp.in_ready = false;
            sync_timers_of(&mut self.heap, qp, i);
        }
    }

    /// Mirrors a QP's armed timers into the heap (at most one live entry per kind).
    #[inline(always)]
    fn sync_timers(&mut self, i: u32) {
        let Some(qp) = self.qps.get_mut(i as usize).and_then(|q| q.as_deref_mut()) else { return };
        sync_timers_of(&mut self.heap, qp, i);
    }
}

/// [`Engine::requeue_front`] of QP `qp` (index `i`, at the front of `ready`).
#[inline(always)]
fn requeue(ready: &mut VecDeque<u32>, heap: &mut BinaryHeap<Reverse<(Instant, u32, u8)>>, qp: &mut Qp, i: u32) {
    sync_timers_of(heap, qp, i);
    if !has_tx_work(qp) {
        qp.in_ready = false;
        ready.pop_front();
    } else if ready.len() > 1 {
        ready.pop_front();
        ready.push_back(i);
    }
}

/// The state a QP must be past to take send WRs (RTS or later): `Some(state)` when it is not.
#[inline]
fn not_ready_to_send(state: QpState) -> Option<QpState> {
    matches!(state, QpState::Reset | QpState::Init | QpState::Rtr).then_some(state)
}

/// The checks of one send WR, for both entry points ([`Engine::post_send`] and its inline form, and
/// [`Engine::post_sends_with`]), in this order so that a WR that breaks several rules gets the same error from each:
/// the QP's state (`not_ready`: [`not_ready_to_send`], which the batch looks at once), the SGE count (`max_sge`:
/// the QP's `max_send_sge`), the message length (at most 2^31; an atomic's is 8), then inline (a payload opcode, at
/// most `max_inline` bytes).
#[inline]
fn check_send_wr(
    not_ready: Option<QpState>,
    (max_sge, max_inline): (u32, u32),
    wr: &SendWr,
    num_sge: usize,
    length: u64,
) -> Result<(), VerbsError> {
    if let Some(state) = not_ready {
        return Err(VerbsError::BadState(state));
    }
    if num_sge > max_sge as usize {
        return Err(VerbsError::TooManySge(num_sge));
    }
    if length > MAX_MSG_LEN || (wr.opcode.is_atomic() && length != 8) {
        return Err(VerbsError::BadLength(length));
    }
    if wr.inline && (wr.opcode.is_rd_atomic() || length > u64::from(max_inline)) {
        return Err(VerbsError::BadInline(length));
    }
    Ok(())
}

/// Appends a send WQE to `qp`'s send queue (its SGEs or inline bytes already in the slot). Inline, with the WR by
/// reference: the WR is copied once, into the slot.
#[inline(always)]
fn push_send(qp: &mut Qp, wr: &SendWr, num_sge: u32, length: u64) {
    let idx = qp.sq.tail;
    *qp.sq.get_mut(idx) = SendWqe {
        wr: *wr,
        num_sge,
        length,
        state: WqeState::Posted,
        first_psn: Psn::new(0),
        last_psn: Psn::new(0),
        counted: false,
    };
    qp.sq.tail = idx.wrapping_add(1);
}

/// After a send WQE was appended to QP `qp` (index `i`): the requester has work, so the QP joins the ready queue
/// if it is not there (a post arms no timer: the requester arms the retransmit timer when it sends). False if the
/// QP is in the error state, where the WQE is flushed instead.
#[inline(always)]
fn wake_requester(qp: &mut Qp, ready: &mut VecDeque<u32>, i: u32) -> bool {
    if qp.state == QpState::Err {
        return false;
    }
    enqueue_ready(qp, ready, i);
    true
}

/// Puts QP `qp` (index `i`) in the ready queue if it has something to send and is not there yet.
#[inline(always)]
fn enqueue_ready(qp: &mut Qp, ready: &mut VecDeque<u32>, i: u32) {
    if !qp.in_ready && has_tx_work(qp) {
        qp.in_ready = true;
        ready.push_back(i);
    }
}

/// QP `qpn`'s index and the QP, if it exists (a lookup that borrows only the QP table).
#[inline(always)]
fn qp_slot(qps: &mut [Option<Box<Qp>>], base: u32, qpn: u32) -> Option<(u32, &mut Qp)> {
    let i = qpn.checked_sub(base)?;
    Some((i, qps.get_mut(i as usize)?.as_deref_mut()?))
}

/// True if QP `qp` has a frame that may leave now: a CNP, an ACK-type response, READ response data or a request
/// (while the pacer holds the QP, Pace armed, only ACK-type responses and CNPs may leave).
#[inline(always)]
fn has_tx_work(qp: &Qp) -> bool {
    let paced = qp.timers.armed & (1 << TimerKind::Pace as u8) != 0;
    qp.np.pending() || qp.response_ready(paced) || (!paced && qp.requester_has_work() && qp.rnr_until.is_none())
}

/// Mirrors the armed timers of QP `qp` (index `i`) into the heap (at most one live entry per kind). Only kinds set
/// since the last sync (`pending`) are looked at: any other armed kind already has an entry at or before its
/// deadline (the entry's expiry re-queues it at the deadline, see `handle_timeout`).
#[inline(always)]
fn sync_timers_of(heap: &mut BinaryHeap<Reverse<(Instant, u32, u8)>>, qp: &mut Qp, i: u32) {
    let mut armed = qp.timers.armed & qp.timers.pending;
    if qp.timers.pending == 0 {
        return;
    }
    qp.timers.pending = 0;
    while armed != 0 {
        let k = armed.trailing_zeros() as usize;
        armed &= armed - 1;
        if let Some(d) = qp.timers.deadline[k] {
            let push = match qp.timers.queued[k] {
                None => true,
                Some(q) => d < q,
            };
            if push {
                qp.timers.queued[k] = Some(d);
                queue_timer(heap, d, i, k as u8);
            }
        }
    }
}

/// Pushes a heap entry. Out of line and cold: a new, earlier deadline is rare next to the per-frame timer sync,
/// and keeping the push out of `sync_qp` spares every call the register saves the push needs.
#[cold]
#[inline(never)]
fn queue_timer(heap: &mut BinaryHeap<Reverse<(Instant, u32, u8)>>, d: Instant, i: u32, k: u8) {
    heap.push(Reverse((d, i, k)));
}

/// The VLAN ID of an 802.1Q-tagged Ethernet frame (TPID 0x8100), None if untagged or too short to tell.
fn vlan_id(frame: &[u8]) -> Option<u16> {
    match frame.get(12..16)? {
        [0x81, 0x00, hi, lo] => Some(u16::from_be_bytes([*hi, *lo]) & 0x0fff),
        _ => None,
    }
}

/// True if a frame from `src` comes from the QP's peer.
fn from_peer(peer: Option<PeerAddr>, src: IpAddrs) -> bool {
    match (peer, src) {
        (Some(p), IpAddrs::V4 { src, .. }) => matches!(p.ip, IpAddrs::V4 { dst, .. } if dst == src),
        (Some(p), IpAddrs::V6 { src, .. }) => matches!(p.ip, IpAddrs::V6 { dst, .. } if dst == src),
        (None, _) => false,
    }
}

/// Why a memory registration was refused, for the user: the region's size or address range if they are the cause,
/// otherwise `full` (the table's own reason).
fn mr_refusal(va: u64, len: u64, full: &'static str) -> VerbsError {
    VerbsError::BadMr(crate::mr::range_refusal(va, len).unwrap_or(full))
}
