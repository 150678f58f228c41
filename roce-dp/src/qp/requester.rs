//! The requester: turns send WQEs into request packets. PSN assignment, segmentation by path MTU, the AckReq
//! policy, the unacknowledged-PSN window, the max_rd_atomic limit, fences, and go-back-N rewinds.

use super::{Qp, QpState, SendWqe, TimerKind, WqeState};
use crate::engine::{Ctx, PayloadSrc, TxExt, TxPlan};
use crate::mr::{AccessError, AccessFlags, MrSpan, MrTable};
use crate::verbs::{Sge, WcStatus, WrOpcode};
use crate::wire::{AtomicEthRepr, Opcode, PayloadCopy, Psn, RethRepr};

/// What the requester has for the wire.
pub(crate) enum ReqOutcome {
    /// A packet to send.
    Packet(TxPlan),
    /// The WQE at `req_cur` failed local validation: complete it with this status (and move to error).
    LocalError(WcStatus),
    /// Nothing to send now (empty, window closed, limits, RNR back-off).
    Idle,
}

/// The request opcode for a packet of a SEND/WRITE message (IBA opcode sequencing, rxe `next_opcode_rc`): one
/// load from [`SEND_WRITE_OPCODES`] (the match below compiled to a chain of compares per packet).
#[inline(always)]
pub(crate) fn send_write_opcode(op: WrOpcode, first: bool, last: bool) -> Opcode {
    SEND_WRITE_OPCODES[op as usize][usize::from(first)][usize::from(last)]
}

/// [`send_write_opcode`] for every work request opcode, first and last flag.
static SEND_WRITE_OPCODES: [[[Opcode; 2]; 2]; 8] = {
    use WrOpcode::*;
    let ops = [Send, SendWithImm, SendWithInv, RdmaWrite, RdmaWriteWithImm, RdmaRead, AtomicCmpSwp, AtomicFetchAdd];
    let mut t = [[[Opcode(0); 2]; 2]; 8];
    let mut i = 0;
    while i < ops.len() {
        assert!(ops[i] as usize == i);
        t[i] = [
            [opcode_by_sequence(ops[i], false, false), opcode_by_sequence(ops[i], false, true)],
            [opcode_by_sequence(ops[i], true, false), opcode_by_sequence(ops[i], true, true)],
        ];
        i += 1;
    }
    t
};

/// The opcode sequencing rule behind [`SEND_WRITE_OPCODES`].
const fn opcode_by_sequence(op: WrOpcode, first: bool, last: bool) -> Opcode {
    match (op, first, last) {
        (WrOpcode::Send, true, true) => Opcode::RC_SEND_ONLY,
        (WrOpcode::SendWithImm, true, true) => Opcode::RC_SEND_ONLY_WITH_IMMEDIATE,
        (WrOpcode::SendWithInv, true, true) => Opcode::RC_SEND_ONLY_WITH_INVALIDATE,
        (WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv, true, false) => Opcode::RC_SEND_FIRST,
        (WrOpcode::Send | WrOpcode::SendWithImm | WrOpcode::SendWithInv, false, false) => Opcode::RC_SEND_MIDDLE,
        (WrOpcode::Send, false, true) => Opcode::RC_SEND_LAST,
        (WrOpcode::SendWithImm, false, true) => Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        (WrOpcode::SendWithInv, false, true) => Opcode::RC_SEND_LAST_WITH_INVALIDATE,
        (WrOpcode::RdmaWrite | WrOpcode::RdmaRead | WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd, true, true) => {
            Opcode::RC_RDMA_WRITE_ONLY
        }
        (WrOpcode::RdmaWriteWithImm, true, true) => Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        (_, true, false) => Opcode::RC_RDMA_WRITE_FIRST,
        (_, false, false) => Opcode::RC_RDMA_WRITE_MIDDLE,
        (WrOpcode::RdmaWriteWithImm, false, true) => Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        (_, false, true) => Opcode::RC_RDMA_WRITE_LAST,
    }
}

/// The extension headers of a SEND/WRITE packet (the first, the last, both or neither of its message) and its
/// SE bit: RETH on a WRITE's first packet, immediate data on a `..WithImm`'s last, IETH on a SEND with
/// invalidate's last; the WR's solicited flag on the last.
#[inline(always)]
fn send_write_ext(wqe: &SendWqe, first: bool, last: bool) -> (TxExt, bool) {
    let op = wqe.wr.opcode;
    let mut ext = TxExt::None;
    let imm = (last && matches!(op, WrOpcode::SendWithImm | WrOpcode::RdmaWriteWithImm)).then_some(wqe.wr.imm);
    if first && matches!(op, WrOpcode::RdmaWrite | WrOpcode::RdmaWriteWithImm) {
        let reth = RethRepr { va: wqe.wr.remote_addr, rkey: wqe.wr.rkey, len: wqe.length as u32 };
        ext = TxExt::Reth(reth, imm);
    } else if let Some(v) = imm {
        ext = TxExt::Imm(v);
    }
    if last && op == WrOpcode::SendWithInv {
        ext = TxExt::Ieth(wqe.wr.invalidate_rkey);
    }
    (ext, last && wqe.wr.solicited)
}

/// Calls `f(lkey, addr, dst_range)` for each piece of `len` bytes starting `off` bytes into the SGL.
/// Stops at the first error. Returns `Err(OutOfBounds)` if the SGL is shorter than `off + len`.
pub(crate) fn for_each_sge_chunk(
    sges: &[Sge],
    mut off: u64,
    len: usize,
    mut f: impl FnMut(u32, u64, core::ops::Range<usize>) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let mut done = 0usize;
    for s in sges {
        if done == len {
            break;
        }
        let slen = u64::from(s.len);
        if off >= slen {
            off -= slen;
            continue;
        }
        let take = ((slen - off) as usize).min(len - done);
        f(s.lkey, s.addr + off, done..done + take)?;
        done += take;
        off = 0;
    }
    if done == len {
        Ok(())
    } else {
        Err(AccessError::OutOfBounds)
    }
}

impl Qp {
    /// The SGEs of send WQE `idx`.
    #[inline]
    pub(crate) fn sq_sgl(&self, idx: u32, n: u32) -> &[Sge] {
        let per = self.caps.max_send_sge.max(1) as usize;
        let base = self.sq.slot(idx) * per;
        &self.sq_sges[base..base + n as usize]
    }

    /// Copies payload bytes of send WQE `idx` starting at message offset `off` into `dst`. On a local access
    /// failure (the application deregistered memory under an in-flight WR) the bytes are zero-filled and false is
    /// returned: the caller counts it, does not send the packet, and fails the WR (LOC_PROT_ERR).
    pub(crate) fn gather(&self, idx: u32, off: u64, dst: &mut [u8], mrs: &MrTable, copy: &mut PayloadCopy) -> bool {
        let wqe = self.sq.get(idx);
        if wqe.wr.inline {
            let per = self.caps.max_inline as usize;
            let base = self.sq.slot(idx) * per + off as usize;
            if let Some(src) = self.sq_inline.get(base..base + dst.len()) {
                copy.copy(dst, src);
                return true;
            }
            dst.fill(0);
            return false;
        }
        let pd = self.pd;
        let sges = self.sq_sgl(idx, wqe.num_sge);
        let r = match sges {
            // One SGE holding the whole piece (the common case): the read, without the chunk walk.
            [s] if off + dst.len() as u64 <= u64::from(s.len) => {
                mrs.read_copy(s.lkey, pd, s.addr + off, dst, AccessFlags::NONE, copy)
            }
            _ => for_each_sge_chunk(sges, off, dst.len(), |lkey, addr, range| {
                mrs.read_copy(lkey, pd, addr, &mut dst[range], AccessFlags::NONE, copy)
            }),
        };
        if r.is_err() {
            dst.fill(0);
            return false;
        }
        true
    }

    /// Writes response payload (READ data, atomic original value) into send WQE `idx`'s SGL at `off`.
    pub(crate) fn scatter_sq(&self, idx: u32, off: u64, src: &[u8], mrs: &mut MrTable) -> Result<(), AccessError> {
        let wqe = self.sq.get(idx);
        let pd = self.pd;
        let sges = self.sq_sgl(idx, wqe.num_sge);
        for_each_sge_chunk(sges, off, src.len(), |lkey, addr, range| {
            mrs.write(lkey, pd, addr, &src[range], AccessFlags::LOCAL_WRITE)
        })
    }

    /// Checks every SGE of a WQE against the regions once, when the requester first takes it: the WQEs with
    /// several SGEs (one SGE: [`sole_sge`](Self::sole_sge) in `next_request`).
    #[inline(never)]
    fn validate_sgl(&self, idx: u32, wqe: &SendWqe, mrs: &MrTable) -> Result<(), WcStatus> {
        if wqe.wr.inline {
            return Ok(());
        }
        let need = if wqe.wr.opcode.is_rd_atomic() { AccessFlags::LOCAL_WRITE } else { AccessFlags::NONE };
        for s in self.sq_sgl(idx, wqe.num_sge) {
            if s.len == 0 {
                continue;
            }
            if mrs.check(s.lkey, self.pd, s.addr, u64::from(s.len), need).is_err() {
                return Err(WcStatus::LocProtErr);
            }
        }
        Ok(())
    }

    /// The SGE of a WQE (not inline) with exactly one, not empty: the one range
    /// [`validate_sgl`](Self::validate_sgl) would check. None for any other WQE (an empty SGE is not checked).
    #[inline]
    fn sole_sge(&self, idx: u32, wqe: &SendWqe) -> Option<Sge> {
        if wqe.wr.inline || wqe.num_sge != 1 {
            return None;
        }
        let s = *self.sq_sgl(idx, 1).first()?;
        (s.len > 0).then_some(s)
    }

    /// Produces the next request packet, if any may leave now.
    pub(crate) fn next_request(&mut self, ctx: &mut Ctx<'_>) -> ReqOutcome {
        if !self.requester_active() {
            return ReqOutcome::Idle;
        }
        if let Some(t) = self.rnr_until {
            if ctx.now < t {
                return ReqOutcome::Idle;
            }
            self.rnr_until = None;
        }
        if self.req_cur == self.sq.tail {
            return ReqOutcome::Idle;
        }
        let idx = self.req_cur;
        let wqe = self.sq.get(idx);
        if wqe.state == WqeState::Posted {
            if self.state == QpState::Sqd {
                return ReqOutcome::Idle;
            }
            // Fence: wait for every earlier READ and atomic to complete.
            if wqe.wr.fence && self.outstanding_rd_atomic > 0 {
                return ReqOutcome::Idle;
            }
            match self.sole_sge(idx, wqe) {
                // validate_sgl's check of a WQE with one SGE, inline. When the whole message leaves in this packet
                // (a SEND/WRITE of at most one MTU), it is also the check of the packet's read, made once here: the
                // read uses its result (no second lookup and checks), and the packet is built by `sole_packet`.
                Some(s) => {
                    let rd_atomic = wqe.wr.opcode.is_rd_atomic();
                    let need = if rd_atomic { AccessFlags::LOCAL_WRITE } else { AccessFlags::NONE };
                    match ctx.mrs.check_span(s.lkey, self.pd, s.addr, u64::from(s.len), need) {
                        // (The message's length is its SGEs', post_send's sum: the packet reads the range whole.)
                        Ok(sp) if !rd_atomic && wqe.length == u64::from(s.len) && s.len <= self.mtu => {
                            return self.sole_packet(ctx, idx, s.len, sp);
                        }
                        Ok(_) if wqe.wr.opcode == WrOpcode::RdmaRead => return self.read_request(ctx, idx),
                        Ok(_) => {}
                        Err(_) => return ReqOutcome::LocalError(WcStatus::LocProtErr),
                    }
                }
                None => {
                    if let Err(st) = self.validate_sgl(idx, wqe, ctx.mrs) {
                        return ReqOutcome::LocalError(st);
                    }
                }
            }
            let n = if wqe.wr.opcode.is_atomic() { 1 } else { self.npkts(wqe.length) };
            let (first, last) = (self.req_psn, self.req_psn.add(n - 1));
            let w = self.sq.get_mut(idx);
            w.first_psn = first;
            w.last_psn = last;
            w.state = WqeState::Started;
        }
        let wqe = self.sq.get(idx);
        if wqe.wr.opcode.is_rd_atomic() && !wqe.counted && self.outstanding_rd_atomic >= u32::from(self.max_rd_atomic) {
            return ReqOutcome::Idle;
        }
        // The window of unacknowledged PSNs.
        if self.req_psn.distance_from(self.comp_psn) >= ctx.cfg.max_unacked_psns {
            return ReqOutcome::Idle;
        }

        let psn = self.req_psn;
        let off = self.psn_offset(wqe, psn);
        let (opcode, ack_req, ext);
        let mut solicited = false;
        let mut payload_len = 0u32;
        let mut src = PayloadSrc::None;
        let op = wqe.wr.opcode;
        match op {
            WrOpcode::RdmaRead => {
                let remaining = wqe.length.saturating_sub(off);
                opcode = Opcode::RC_RDMA_READ_REQUEST;
                ext = TxExt::Reth(
                    RethRepr { va: wqe.wr.remote_addr.wrapping_add(off), rkey: wqe.wr.rkey, len: remaining as u32 },
                    None,
                );
                ack_req = true;
                self.req_psn = wqe.last_psn.add(1);
                self.req_cur = idx.wrapping_add(1);
            }
            WrOpcode::AtomicCmpSwp | WrOpcode::AtomicFetchAdd => {
                opcode = if op == WrOpcode::AtomicCmpSwp { Opcode::RC_COMPARE_SWAP } else { Opcode::RC_FETCH_ADD };
                let (swap_add, compare) = if op == WrOpcode::AtomicCmpSwp {
                    (wqe.wr.swap, wqe.wr.compare_add)
                } else {
                    (wqe.wr.compare_add, 0)
                };
                ext = TxExt::Atomic(AtomicEthRepr { va: wqe.wr.remote_addr, rkey: wqe.wr.rkey, swap_add, compare });
                ack_req = true;
                self.req_psn = psn.add(1);
                self.req_cur = idx.wrapping_add(1);
            }
            _ => {
                let mtu = u64::from(self.mtu);
                let remaining = wqe.length.saturating_sub(off);
                let first = off == 0;
                let last = remaining <= mtu;
                let len = remaining.min(mtu) as u32;
                opcode = send_write_opcode(op, first, last);
                (ext, solicited) = send_write_ext(wqe, first, last);
                // AckReq on the last packet of a message, and every `ack_req_every` packets within long ones.
                self.noack_pkts += 1;
                ack_req = last || self.noack_pkts >= ctx.cfg.ack_req_every;
                payload_len = len;
                if len > 0 {
                    src = PayloadSrc::Sq { idx, off };
                }
                self.req_psn = psn.add(1);
                if last {
                    self.req_cur = idx.wrapping_add(1);
                }
            }
        }
        if ack_req {
            self.noack_pkts = 0;
        }
        if op.is_rd_atomic() && !wqe.counted {
            self.sq.get_mut(idx).counted = true;
            self.outstanding_rd_atomic += 1;
        }
        self.finish_request(ctx, psn, opcode, solicited, ack_req, ext, payload_len, src)
    }

    /// The packet of a SEND/WRITE that leaves whole in it, from one SGE of `len` bytes (at most one MTU, not
    /// empty) whose check gave `span`: [`next_request`](Self::next_request)'s steps for a first-and-last packet
    /// of a WQE just taken (its PSNs, the window, opcode and headers, AckReq, the requester's position), without
    /// working out which packet of the message this is.
    #[inline(always)]
    fn sole_packet(&mut self, ctx: &mut Ctx<'_>, idx: u32, len: u32, span: MrSpan) -> ReqOutcome {
        let psn = self.req_psn;
        let w = self.sq.get_mut(idx);
        (w.first_psn, w.last_psn, w.state) = (psn, psn, WqeState::Started);
        // The window of unacknowledged PSNs (a WQE left Started here goes out by the general path later).
        if psn.distance_from(self.comp_psn) >= ctx.cfg.max_unacked_psns {
            return ReqOutcome::Idle;
        }
        let wqe = self.sq.get(idx);
        let wr = &wqe.wr;
        let opcode = send_write_opcode(wr.opcode, true, true);
        // send_write_ext's headers of a first-and-last packet, by the WR's opcode.
        let reth = RethRepr { va: wr.remote_addr, rkey: wr.rkey, len };
        let ext = match wr.opcode {
            WrOpcode::RdmaWrite => TxExt::Reth(reth, None),
            WrOpcode::RdmaWriteWithImm => TxExt::Reth(reth, Some(wr.imm)),
            WrOpcode::SendWithImm => TxExt::Imm(wr.imm),
            WrOpcode::SendWithInv => TxExt::Ieth(wr.invalidate_rkey),
            _ => TxExt::None,
        };
        let solicited = wr.solicited;
        // The last packet: AckReq, the count of packets without it starts again.
        self.noack_pkts = 0;
        self.req_psn = psn.add(1);
        self.req_cur = idx.wrapping_add(1);
        self.finish_request(ctx, psn, opcode, solicited, true, ext, len, PayloadSrc::Span(span))
    }

    /// The request of a READ with one SGE (checked) just taken: [`next_request`](Self::next_request)'s steps for
    /// it (one packet, whatever the length: its PSNs are the response packets'), without working out which
    /// packet of the message this is.
    #[inline(always)]
    fn read_request(&mut self, ctx: &mut Ctx<'_>, idx: u32) -> ReqOutcome {
        let psn = self.req_psn;
        let w = self.sq.get(idx);
        let (length, va, rkey, counted) = (w.length, w.wr.remote_addr, w.wr.rkey, w.counted);
        let last = psn.add(self.npkts(length) - 1);
        let w = self.sq.get_mut(idx);
        (w.first_psn, w.last_psn, w.state) = (psn, last, WqeState::Started);
        if !counted && self.outstanding_rd_atomic >= u32::from(self.max_rd_atomic) {
            return ReqOutcome::Idle;
        }
        // The window of unacknowledged PSNs (a WQE left Started goes out by the general path later).
        if psn.distance_from(self.comp_psn) >= ctx.cfg.max_unacked_psns {
            return ReqOutcome::Idle;
        }
        self.noack_pkts = 0;
        self.req_psn = last.add(1);
        self.req_cur = idx.wrapping_add(1);
        if !counted {
            self.sq.get_mut(idx).counted = true;
            self.outstanding_rd_atomic += 1;
        }
        let ext = TxExt::Reth(RethRepr { va, rkey, len: length as u32 }, None);
        self.finish_request(ctx, psn, Opcode::RC_RDMA_READ_REQUEST, false, true, ext, 0, PayloadSrc::None)
    }

    /// The end of [`next_request`](Self::next_request) for the packet at `psn` (the requester's position already
    /// moved past it): retransmission count or the highest PSN sent, the local ACK timer, the BTH.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn finish_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        psn: Psn,
        opcode: Opcode,
        solicited: bool,
        ack_req: bool,
        ext: TxExt,
        payload_len: u32,
        src: PayloadSrc,
    ) -> ReqOutcome {
        let retransmit = psn.before(self.req_max_psn);
        // A packet that is not a retransmission starts at req_max_psn and moves it past its PSNs. Not a signed
        // compare of the two: a READ of 2^31 bytes at MTU 256 takes 2^23 PSNs (ROCE-NOTES §4.5), where the
        // half-space comparison says "not after" and the READ was left outstanding with nothing counted as sent.
        if !retransmit {
            self.req_max_psn = self.req_psn;
        }
        if retransmit {
            self.cnt.retransmitted_packets += 1;
        }
        if self.timers.get(TimerKind::Retransmit).is_none() {
            if let Some(t) = self.ack_timeout() {
                self.timers.set(TimerKind::Retransmit, ctx.now + t);
            }
        }
        let bth = self.hdr.packet_bth(opcode, solicited, ack_req, psn);
        ReqOutcome::Packet(TxPlan { bth, ext, payload_len, src, data_frame: true })
    }

    /// Go-back-N: resend from the oldest unacknowledged PSN (`comp_psn`), starting in the middle of a message or
    /// a READ where needed. WQEs keep their PSNs; only the requester's position moves.
    pub(crate) fn rewind(&mut self) {
        self.cnt.rewinds += 1;
        self.reposition();
    }

    /// Points the requester at `comp_psn` (inside the WQE that holds it).
    pub(crate) fn reposition(&mut self) {
        self.req_psn = self.comp_psn;
        self.noack_pkts = 0;
        // Skip WQEs that are wholly acknowledged but not yet retired (none: retirement is immediate) and position
        // at the one containing comp_psn.
        let mut i = self.sq.head;
        while i != self.sq.tail {
            let w = self.sq.get(i);
            if w.state != WqeState::Started {
                break;
            }
            if self.comp_psn.diff(w.last_psn) <= 0 {
                break;
            }
            i = i.wrapping_add(1);
        }
        self.req_cur = i;
    }

    /// True if the requester may have a packet ready now (used to keep the QP in the ready queue).
    pub(crate) fn requester_has_work(&self) -> bool {
        self.requester_active() && self.req_cur != self.sq.tail
    }
}
