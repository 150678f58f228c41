//! The responder: checks each request in the order rxe and the IBA give (PSN, op sequence, op valid, resources,
//! length, rkey), executes it, and queues the response: ACK (coalesced by an explicit policy), NAK, RNR NAK, READ
//! response packets or an atomic ACK. Duplicates are re-ACKed (SEND/WRITE), re-executed (READ) or replayed from
//! the resource ring (atomics, never executed twice).

use super::{Qp, QpState, RecvWqe, Resource, RespMsg, RespOut, TimerKind, MAX_MSG_LEN};
use crate::engine::{Ctx, PayloadSrc, TxExt, TxPlan};
use crate::mr::{AccessError, AccessFlags};
use crate::verbs::{Cqe, Sge, WcOpcode, WcStatus};
use crate::wire::{op, AethRepr, BthRepr, NakCode, Opcode, RxFrame};

/// Why a request is refused; each maps to one AETH NAK (or RNR NAK).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RespError {
    /// No receive WQE: RNR NAK.
    Rnr,
    /// Op sequence, unsupported op, length, too many READ/atomics: NAK invalid request.
    InvalidRequest,
    /// rkey, bounds or rights: NAK remote access error.
    RemoteAccess,
    /// The receive WQE could not take the data: NAK remote operational error.
    RemoteOp,
}

impl Qp {
    /// The SGEs of receive WQE `idx`.
    #[inline]
    fn rq_sgl(&self, idx: u32, n: u32) -> &[Sge] {
        let per = self.caps.max_recv_sge.max(1) as usize;
        let base = self.rq.slot(idx) * per;
        &self.rq_sges[base..base + n as usize]
    }

    /// Handles a request packet addressed to this QP. Inline into the engine's receive path together with the
    /// checks and WRITE placement (one stack frame from the frame to the copy); SEND (its SGE scatter), READ,
    /// atomics and duplicates are calls of their own.
    #[inline(always)]
    pub(crate) fn handle_request(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) {
        if !self.responder_active() {
            self.cnt.dropped_requests += 1;
            return;
        }
        let bth = f.bth();
        let flags = bth.opcode.flags();
        if flags & op::RC == 0 {
            // UC/UD opcodes on an RC QP: wrong transport, silently dropped.
            self.cnt.dropped_requests += 1;
            return;
        }
        // C9-... check_psn: ahead -> one NAK per gap; behind -> duplicate.
        let diff = bth.psn.diff(self.resp_psn);
        if diff > 0 {
            self.cnt.out_of_sequence += 1;
            if !self.sent_psn_nak {
                self.sent_psn_nak = true;
                self.cnt.nak_psn_seq_sent += 1;
                self.queue_ack(RespOut::Ack {
                    psn: self.resp_psn,
                    syndrome: AethRepr::nak(NakCode::PsnSeqErr, 0).syndrome,
                    msn: self.msn,
                });
            }
            return;
        }
        if diff < 0 {
            self.cnt.duplicate_requests += 1;
            self.duplicate_request(ctx, f);
            return;
        }
        self.sent_psn_nak = false;
        match self.check_and_execute(ctx, f) {
            Ok(()) => {
                self.cnt.rx_packets += 1;
                self.cnt.rx_bytes += f.payload.len() as u64;
            }
            Err(RespError::Rnr) => {
                self.cnt.rnr_nak_sent += 1;
                // The RNR NAK names the expected PSN, which the requester resends after the RNR timer: it is the NAK
                // of the gap the rest of the message opens, so no sequence NAK follows it (ROCE-NOTES §1.5, one NAK
                // per gap; qib/hfi1 keep the RNR NAK in r_nak_state). One would cost the requester a transport retry.
                self.sent_psn_nak = true;
                self.queue_ack(RespOut::Ack {
                    psn: bth.psn,
                    syndrome: AethRepr::rnr_nak(self.min_rnr_timer, 0).syndrome,
                    msn: self.msn,
                });
            }
            Err(e) => {
                let code = match e {
                    RespError::InvalidRequest => {
                        self.cnt.nak_inv_req_sent += 1;
                        NakCode::InvalidRequest
                    }
                    RespError::RemoteAccess => {
                        self.cnt.nak_rem_access_sent += 1;
                        NakCode::RemoteAccessErr
                    }
                    _ => {
                        self.cnt.nak_rem_op_sent += 1;
                        NakCode::RemoteOpErr
                    }
                };
                self.queue_ack(RespOut::Ack { psn: bth.psn, syndrome: AethRepr::nak(code, 0).syndrome, msn: self.msn });
                // Fatal responder errors take the QP to the error state once the NAK is queued.
                self.enter_error(ctx);
            }
        }
    }

    /// check_op_seq -> check_op_valid -> check_resource -> check_length -> check_rkey -> execute.
    #[inline(always)]
    fn check_and_execute(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) -> Result<(), RespError> {
        let bth = f.bth();
        let flags = bth.opcode.flags();
        let len = f.payload.len() as u64;
        let mtu = u64::from(self.mtu);
        // The two commonest requests (a short WRITE, the body of a long one): `check_generic` as it comes out for
        // their flags (WRITE, payload; no receive WQE or resource), without testing the flags one by one.
        if bth.opcode == Opcode::RC_RDMA_WRITE_ONLY {
            // Between messages, REMOTE_WRITE granted, at most one MTU.
            if !matches!(self.resp_msg, RespMsg::Idle) || !self.access.contains(AccessFlags::REMOTE_WRITE) || len > mtu
            {
                return Err(RespError::InvalidRequest);
            }
        } else if bth.opcode == Opcode::RC_RDMA_WRITE_MIDDLE {
            // Inside a WRITE, REMOTE_WRITE granted, exactly one MTU.
            let inside = matches!(self.resp_msg, RespMsg::Write { .. });
            if !inside || !self.access.contains(AccessFlags::REMOTE_WRITE) || len != mtu {
                return Err(RespError::InvalidRequest);
            }
        } else {
            self.check_generic(flags, len, mtu)?;
            if flags & op::SEND != 0 {
                return self.execute_send(ctx, f);
            }
            if flags & op::WRITE == 0 {
                if flags & op::READ != 0 {
                    return self.execute_read(ctx, f);
                }
                return self.execute_atomic(ctx, f);
            }
        }
        self.execute_write(ctx, f)
    }

    /// check_op_seq -> check_op_valid -> check_resource -> check_length of a request with opcode flags `flags` and
    /// `len` bytes of payload.
    #[inline(always)]
    fn check_generic(&self, flags: u32, len: u64, mtu: u64) -> Result<(), RespError> {
        // check_op_seq: inside a SEND only SEND MIDDLE/LAST may follow, inside a WRITE only WRITE MIDDLE/LAST;
        // between messages only FIRST/ONLY packets.
        let seq_ok = match self.resp_msg {
            RespMsg::Idle => flags & op::FIRST != 0,
            RespMsg::Send { .. } => flags & op::SEND != 0 && flags & op::FIRST == 0,
            RespMsg::Write { .. } => flags & op::WRITE != 0 && flags & op::FIRST == 0,
        };
        if !seq_ok {
            return Err(RespError::InvalidRequest);
        }
        // check_op_valid: the QP must grant the remote right; FLUSH and ATOMIC_WRITE are not supported.
        let need = if flags & op::WRITE != 0 {
            Some(AccessFlags::REMOTE_WRITE)
        } else if flags & op::READ != 0 {
            Some(AccessFlags::REMOTE_READ)
        } else if flags & op::ATOMIC != 0 {
            Some(AccessFlags::REMOTE_ATOMIC)
        } else if flags & op::SEND != 0 {
            None
        } else {
            return Err(RespError::InvalidRequest);
        };
        if let Some(n) = need {
            if !self.access.contains(n) {
                return Err(RespError::InvalidRequest);
            }
        }
        // check_resource: a receive WQE for SEND (at its first packet) and WRITE with immediate (at its last);
        // a responder resource for READ/atomic.
        let needs_rwqe = flags & op::RWR != 0 && (flags & op::FIRST != 0 || flags & op::SEND == 0);
        if needs_rwqe && self.rq.head == self.rq.tail {
            return Err(RespError::Rnr);
        }
        // READ/atomic resources are a ring that is recycled: keeping within max_dest_rd_atomic is the requester's
        // job (rxe does the same); a responder without resources refuses them.
        if flags & (op::READ | op::ATOMIC) != 0 && self.resources.is_empty() {
            return Err(RespError::InvalidRequest);
        }
        // check_length (C9-92, C9-94): FIRST/MIDDLE carry exactly one MTU, LAST 1..=MTU, ONLY at most MTU.
        if flags & op::PAYLOAD != 0 {
            let ok = match (flags & op::FIRST != 0, flags & op::LAST != 0) {
                (true, true) => len <= mtu,
                (false, true) => len >= 1 && len <= mtu,
                _ => len == mtu,
            };
            if !ok {
                return Err(RespError::InvalidRequest);
            }
        }
        Ok(())
    }

    #[inline(never)]
    fn execute_send(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) -> Result<(), RespError> {
        let bth = f.bth();
        let flags = bth.opcode.flags();
        let off = match self.resp_msg {
            RespMsg::Send { off } => off,
            _ => 0,
        };
        let idx = self.rq.head;
        let rwqe: RecvWqe = *self.rq.get(idx);
        let len = f.payload.len() as u64;
        if off + len > rwqe.capacity {
            // The message is longer than the receive buffer: C9-... local length error at the responder.
            self.complete_recv(ctx, WcStatus::LocLenErr, WcOpcode::Recv, 0, None, None, false);
            return Err(RespError::InvalidRequest);
        }
        if len > 0 {
            let pd = self.pd;
            let sges = self.rq_sgl(idx, rwqe.num_sge);
            let r = crate::qp::requester::for_each_sge_chunk(sges, off, f.payload.len(), |lkey, addr, range| {
                ctx.mrs.write(lkey, pd, addr, &f.payload[range], AccessFlags::LOCAL_WRITE)
            });
            if r.is_err() {
                self.complete_recv(ctx, WcStatus::LocProtErr, WcOpcode::Recv, 0, None, None, false);
                return Err(RespError::RemoteOp);
            }
        }
        self.advance(ctx, &bth);
        if flags & op::LAST != 0 {
            self.resp_msg = RespMsg::Idle;
            self.msn = (self.msn + 1) & 0x00ff_ffff;
            let mut inv = None;
            if let Some(rkey) = f.ieth() {
                // C10-...: the invalidated rkey must belong to this QP's PD and be a remote key.
                if ctx.mrs.invalidate_remote(rkey, self.pd).is_err() {
                    self.complete_recv(ctx, WcStatus::RemInvReqErr, WcOpcode::Recv, 0, None, None, false);
                    return Err(RespError::InvalidRequest);
                }
                inv = Some(rkey);
            }
            self.complete_recv(ctx, WcStatus::Success, WcOpcode::Recv, (off + len) as u32, f.imm(), inv, bth.solicited);
        } else {
            self.resp_msg = RespMsg::Send { off: off + len };
        }
        self.ack_if_requested(ctx, &bth);
        Ok(())
    }

    #[inline(always)]
    fn execute_write(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) -> Result<(), RespError> {
        let bth = f.bth();
        let flags = bth.opcode.flags();
        let len = f.payload.len() as u64;
        let mut placed = false;
        let (rkey, va, resid, total) = if flags & op::FIRST != 0 {
            let Some(reth) = f.reth() else { return Err(RespError::InvalidRequest) };
            let total = u64::from(reth.len);
            if total > MAX_MSG_LEN {
                return Err(RespError::InvalidRequest);
            }
            // C9-88: a zero-length WRITE needs no valid rkey.
            if total > 0 && len == total && flags & op::LAST != 0 {
                // WRITE_ONLY carrying the whole message: placing it checks exactly the rkey, bounds and access
                // the separate check below would (same key, address, length and rights), so check once.
                ctx.mrs
                    .write(reth.rkey, self.pd, reth.va, f.payload, AccessFlags::REMOTE_WRITE)
                    .map_err(|_: AccessError| RespError::RemoteAccess)?;
                placed = true;
            } else if total > 0 {
                ctx.mrs
                    .check(reth.rkey, self.pd, reth.va, total, AccessFlags::REMOTE_WRITE)
                    .map_err(|_| RespError::RemoteAccess)?;
            }
            (reth.rkey, reth.va, total, total)
        } else {
            match self.resp_msg {
                RespMsg::Write { rkey, va, resid, total } => (rkey, va, resid, total),
                _ => return Err(RespError::InvalidRequest),
            }
        };
        let last = flags & op::LAST != 0;
        if len > resid || (last && len != resid) {
            return Err(RespError::InvalidRequest);
        }
        if len > 0 && !placed {
            ctx.mrs
                .write(rkey, self.pd, va, f.payload, AccessFlags::REMOTE_WRITE)
                .map_err(|_: AccessError| RespError::RemoteAccess)?;
        }
        self.advance(ctx, &bth);
        if last {
            self.resp_msg = RespMsg::Idle;
            self.msn = (self.msn + 1) & 0x00ff_ffff;
            if flags & op::IMM_DT != 0 {
                self.complete_recv(
                    ctx,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    total as u32,
                    f.imm(),
                    None,
                    bth.solicited,
                );
            }
        } else {
            self.resp_msg = RespMsg::Write { rkey, va: va + len, resid: resid - len, total };
        }
        self.ack_if_requested(ctx, &bth);
        Ok(())
    }

    #[inline(never)]
    fn execute_read(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) -> Result<(), RespError> {
        let bth = f.bth();
        let Some(reth) = f.reth() else { return Err(RespError::InvalidRequest) };
        let len = u64::from(reth.len);
        if len > MAX_MSG_LEN {
            return Err(RespError::InvalidRequest);
        }
        if len > 0 {
            ctx.mrs
                .check(reth.rkey, self.pd, reth.va, len, AccessFlags::REMOTE_READ)
                .map_err(|_| RespError::RemoteAccess)?;
        }
        let n = self.npkts(len);
        let first = bth.psn;
        let last = first.add(n - 1);
        // C9-148: the MSN counts a READ when it is executed.
        self.msn = (self.msn + 1) & 0x00ff_ffff;
        self.resp_psn = last.add(1);
        let msn = self.msn;
        self.save_resource(Resource::Read { rkey: reth.rkey, va: reth.va, len, first, last, msn });
        self.queue_out(RespOut::Read { rkey: reth.rkey, va: reth.va, len, first, start: first, cur: first, last, msn });
        let _ = ctx;
        Ok(())
    }

    #[inline(never)]
    fn execute_atomic(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) -> Result<(), RespError> {
        let bth = f.bth();
        let Some(a) = f.atomic_eth() else { return Err(RespError::InvalidRequest) };
        if a.va & 7 != 0 {
            return Err(RespError::InvalidRequest);
        }
        let orig = if bth.opcode == Opcode::RC_COMPARE_SWAP {
            ctx.mrs.atomic(a.rkey, self.pd, a.va, |v| if v == a.compare { a.swap_add } else { v })
        } else {
            ctx.mrs.atomic(a.rkey, self.pd, a.va, |v| v.wrapping_add(a.swap_add))
        }
        .map_err(|_| RespError::RemoteAccess)?;
        self.msn = (self.msn + 1) & 0x00ff_ffff;
        self.resp_psn = bth.psn.add(1);
        let msn = self.msn;
        self.save_resource(Resource::Atomic { psn: bth.psn, orig, msn });
        self.queue_out(RespOut::AtomicAck { psn: bth.psn, orig, msn });
        Ok(())
    }

    /// Accepting an in-order SEND/WRITE packet moves the expected PSN.
    #[inline]
    fn advance(&mut self, _ctx: &mut Ctx<'_>, bth: &BthRepr) {
        self.resp_psn = bth.psn.add(1);
    }

    fn save_resource(&mut self, r: Resource) {
        let n = self.resources.len();
        self.resources[self.res_next % n] = r;
        self.res_next = (self.res_next + 1) % n;
    }

    /// Completes the receive WQE at the head of the RQ (`solicited`: the message's last packet had the BTH SE bit).
    #[allow(clippy::too_many_arguments)]
    fn complete_recv(
        &mut self,
        ctx: &mut Ctx<'_>,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        invalidated_rkey: Option<u32>,
        solicited: bool,
    ) {
        if self.rq.head == self.rq.tail {
            return;
        }
        let r = *self.rq.get(self.rq.head);
        self.rq.head = self.rq.head.wrapping_add(1);
        let cqe = Cqe { wr_id: r.wr_id, status, opcode, qpn: self.qpn, byte_len, imm, invalidated_rkey, solicited };
        self.cnt.recv_completions += 1;
        if !ctx.push_cqe(self.recv_cq, cqe) {
            self.cnt.cq_overflows += 1;
            if self.state != QpState::Err {
                self.enter_error(ctx);
            }
        }
    }

    /// Duplicate requests (PSN behind the expected one).
    #[inline(never)]
    fn duplicate_request(&mut self, _ctx: &mut Ctx<'_>, f: &RxFrame<'_>) {
        let bth = f.bth();
        let flags = bth.opcode.flags();
        if flags & (op::SEND | op::WRITE) != 0 {
            // C9-105: acknowledge again, with the PSN of the last request accepted.
            self.queue_ack(RespOut::Ack {
                psn: self.resp_psn.sub(1),
                syndrome: AethRepr::ACK_UNLIMITED,
                msn: self.msn,
            });
            return;
        }
        if flags & op::READ != 0 {
            let Some(reth) = f.reth() else {
                self.cnt.dropped_requests += 1;
                return;
            };
            let mtu = u64::from(self.mtu);
            let found = super::newest_resource(&self.resources, self.res_next, |r| match *r {
                Resource::Read { rkey, va, len, first, last, msn }
                    if rkey == reth.rkey && !bth.psn.before(first) && !bth.psn.after(last) =>
                {
                    let skip = u64::from(bth.psn.distance_from(first)) * mtu;
                    (reth.va == va.wrapping_add(skip) && u64::from(reth.len) == len.saturating_sub(skip))
                        .then_some((va, len, first, last, msn, skip))
                }
                _ => None,
            });
            match found {
                Some((va, len, first, last, msn, _)) => {
                    // Re-execute from the requested PSN (the data is read from memory again).
                    let psn = bth.psn;
                    self.queue_replay(
                        psn,
                        RespOut::Read { rkey: reth.rkey, va, len, first, start: psn, cur: psn, last, msn },
                    );
                }
                None => self.cnt.dropped_requests += 1,
            }
            return;
        }
        if flags & op::ATOMIC != 0 {
            let found = super::newest_resource(&self.resources, self.res_next, |r| match *r {
                Resource::Atomic { psn, orig, msn } if psn == bth.psn => Some((orig, msn)),
                _ => None,
            });
            match found {
                // Replay the saved result: an atomic is never executed twice.
                Some((orig, msn)) => self.queue_replay(bth.psn, RespOut::AtomicAck { psn: bth.psn, orig, msn }),
                None => self.cnt.dropped_requests += 1,
            }
            return;
        }
        self.cnt.dropped_requests += 1;
    }

    /// Queues the answer to a duplicate READ/atomic at `psn` in PSN order: it replaces the queued READ stream or
    /// atomic ACK that holds `psn` (a stream restarted from `psn`), or goes in front of the first queued response to
    /// a later request. Those later responses stay queued behind it: their requests were executed, and when the
    /// network (not the requester's go-back-N) duplicated the request, nothing would ask for them again before the
    /// requester's local ACK timeout. A requester that did go back asks for them again, and each such duplicate
    /// replaces its own stream in place.
    fn queue_replay(&mut self, psn: crate::wire::Psn, item: RespOut) {
        self.flush_pending_ack();
        let at = self.out.iter().position(|o| match *o {
            RespOut::Read { last, .. } => !last.before(psn),
            RespOut::AtomicAck { psn: p, .. } => !p.before(psn),
            RespOut::Ack { .. } => false,
        });
        match at {
            Some(i) => {
                let holds = match self.out[i] {
                    RespOut::Read { first, .. } => !psn.before(first),
                    RespOut::AtomicAck { psn: p, .. } => p == psn,
                    RespOut::Ack { .. } => false,
                };
                if holds {
                    self.out[i] = item;
                } else if self.out.len() < self.out_cap {
                    self.out.insert(i, item);
                } else {
                    self.cnt.dropped_requests += 1;
                }
            }
            None => self.queue_out(item),
        }
    }

    /// The ACK-coalescing policy: an AckReq'd packet makes an ACK due; it is sent at once, or held until
    /// `ack_coalesce_pkts` AckReq'd packets have accumulated or `ack_coalesce_delay` has passed since the first.
    #[inline(always)]
    fn ack_if_requested(&mut self, ctx: &mut Ctx<'_>, bth: &BthRepr) {
        // A packet whose execution moved the QP to the error state (its receive completion overflowed the CQ) is
        // not acknowledged: the requester must not see a success for a message whose completion was lost.
        if !bth.ack_req || self.state == QpState::Err {
            return;
        }
        let pol = &ctx.cfg.ack;
        if self.pending_ack.is_none() && (pol.max_pkts <= 1 || pol.max_delay.as_nanos() == 0) {
            // ACK at once with nothing held (the default policy): what holding and flushing it would do, without
            // the round trip through `pending_ack` (no AckCoalesce timer is armed while nothing is held). Inline
            // in the receive path; a plain ACK at the tail of the queue is overwritten in place (push_ack).
            self.cnt.acks_sent += 1;
            if let Some(RespOut::Ack { psn, syndrome: AethRepr::ACK_UNLIMITED, msn }) = self.out.back_mut() {
                (*psn, *msn) = (bth.psn, self.msn);
                return;
            }
            self.push_ack(RespOut::Ack { psn: bth.psn, syndrome: AethRepr::ACK_UNLIMITED, msn: self.msn });
            return;
        }
        self.hold_ack(ctx, bth);
    }

    /// [`ack_if_requested`](Self::ack_if_requested) under a coalescing policy, or with an ACK already held.
    #[inline(never)]
    fn hold_ack(&mut self, ctx: &mut Ctx<'_>, bth: &BthRepr) {
        let pol = &ctx.cfg.ack;
        let n = match self.pending_ack {
            Some((_, n, _)) => n + 1,
            None => 1,
        };
        self.pending_ack = Some((bth.psn, n, self.msn));
        if n >= pol.max_pkts.max(1) || pol.max_delay.as_nanos() == 0 {
            self.flush_pending_ack();
        } else if n == 1 {
            self.timers.set(TimerKind::AckCoalesce, ctx.now + pol.max_delay);
        }
    }

    /// Moves a held ACK into the outbound queue, with the MSN of its PSN (C9-148: a READ or atomic executed since
    /// counts from its own PSN on, not in an ACK of an earlier one).
    pub(crate) fn flush_pending_ack(&mut self) {
        if let Some((psn, _, msn)) = self.pending_ack.take() {
            self.timers.stop(TimerKind::AckCoalesce);
            self.cnt.acks_sent += 1;
            self.push_ack(RespOut::Ack { psn, syndrome: AethRepr::ACK_UNLIMITED, msn });
        }
    }

    /// Queues an ACK/NAK behind any held ACK.
    fn queue_ack(&mut self, a: RespOut) {
        self.flush_pending_ack();
        self.push_ack(a);
    }

    /// Appends an ACK-type item, merging with a plain ACK at the tail (a newer ACK covers an older one).
    fn push_ack(&mut self, a: RespOut) {
        if let (Some(RespOut::Ack { syndrome: s_old, .. }), RespOut::Ack { syndrome: s_new, .. }) = (self.out.back(), a)
        {
            if *s_old == AethRepr::ACK_UNLIMITED && s_new == AethRepr::ACK_UNLIMITED {
                *self.out.back_mut().expect("non-empty") = a;
                return;
            }
        }
        if self.out.len() >= self.out_cap {
            // Only reachable by a flood of duplicates: dropping an ACK is safe (the requester retries).
            self.cnt.dropped_requests += 1;
            return;
        }
        self.out.push_back(a);
    }

    /// Queues a READ response or atomic ACK behind any held ACK.
    fn queue_out(&mut self, item: RespOut) {
        self.flush_pending_ack();
        if self.out.len() >= self.out_cap {
            self.cnt.dropped_requests += 1;
            return;
        }
        self.out.push_back(item);
    }

    /// The next response packet, if any.
    pub(crate) fn next_response(&mut self, ctx: &mut Ctx<'_>) -> Option<TxPlan> {
        let item = *self.out.front()?;
        let base = self.hdr.bth();
        // The template's words have opcode, SE, AckReq and PSN zero ([`HeaderTemplate::packet_bth`]).
        let bth = |opcode, psn| base.with_cleared(opcode, false, false, psn);
        let mut ext = TxExt::None;
        match item {
            RespOut::Ack { psn, syndrome, msn } => {
                self.out.pop_front();
                ext = TxExt::Aeth(AethRepr { syndrome, msn }, None);
                Some(TxPlan {
                    bth: bth(Opcode::RC_ACKNOWLEDGE, psn),
                    ext,
                    payload_len: 0,
                    src: PayloadSrc::None,
                    data_frame: false,
                })
            }
            RespOut::AtomicAck { psn, orig, msn } => {
                self.out.pop_front();
                ext = TxExt::Aeth(AethRepr::ack(msn), Some(orig));
                Some(TxPlan {
                    bth: bth(Opcode::RC_ATOMIC_ACKNOWLEDGE, psn),
                    ext,
                    payload_len: 0,
                    src: PayloadSrc::None,
                    data_frame: false,
                })
            }
            RespOut::Read { rkey, va, len, first, start, cur, last, msn } => {
                let mtu = u64::from(self.mtu);
                let off = u64::from(cur.distance_from(first)) * mtu;
                let plen = len.saturating_sub(off).min(mtu);
                let is_first_pkt = cur == start;
                let is_last = cur == last;
                let opcode = match (is_first_pkt, is_last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                if is_first_pkt || is_last {
                    ext = TxExt::Aeth(AethRepr::ack(msn), None);
                }
                // The region may have been invalidated since the request: answer with a NAK instead of data. The
                // packet's read uses this check's result (`PayloadSrc::Span`).
                let span = if plen > 0 {
                    ctx.mrs.check_span(rkey, self.pd, va + off, plen, AccessFlags::REMOTE_READ)
                } else {
                    Err(AccessError::OutOfBounds)
                };
                if plen > 0 && span.is_err() {
                    self.out.pop_front();
                    self.cnt.nak_rem_access_sent += 1;
                    ext = TxExt::Aeth(AethRepr::nak(NakCode::RemoteAccessErr, msn), None);
                    self.enter_error(ctx);
                    let bth = bth(Opcode::RC_ACKNOWLEDGE, cur);
                    return Some(TxPlan { bth, ext, payload_len: 0, src: PayloadSrc::None, data_frame: false });
                }
                if is_last {
                    self.out.pop_front();
                } else if let Some(RespOut::Read { cur: c, .. }) = self.out.front_mut() {
                    *c = cur.add(1);
                }
                let src = span.map_or(PayloadSrc::None, PayloadSrc::Span);
                Some(TxPlan { bth: bth(opcode, cur), ext, payload_len: plen as u32, src, data_frame: true })
            }
        }
    }
}
