//! The completer: ACKs, NAKs, READ responses and atomic ACKs become completions, retries or errors.
//!
//! Responses carry PSNs of requests; `comp_psn` is the oldest PSN not yet acknowledged. A response at or beyond it
//! implicitly acknowledges every earlier SEND/WRITE packet, but never an outstanding READ or atomic: their data
//! must arrive in their own responses, so an ACK past one means responses were lost and the requester goes back.

use super::{Qp, QpState, RespOut, TimerKind, WqeState, RNR_TIMER_US};
use crate::engine::Ctx;
use crate::time::Duration;
use crate::verbs::{Cqe, WcStatus};
use crate::wire::{op, AethKind, NakCode, Opcode, Psn, RxFrame};

impl Qp {
    /// Handles a response packet addressed to this QP.
    pub(crate) fn handle_response(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) {
        if !self.requester_active() {
            self.cnt.bad_responses += 1;
            return;
        }
        let psn = f.bth().psn;
        let opcode = f.bth().opcode;
        // A response for a PSN we never sent is bogus; one before comp_psn is stale (already handled).
        if !psn.before(self.req_max_psn) {
            self.cnt.bad_responses += 1;
            return;
        }
        if psn.before(self.comp_psn) {
            self.cnt.duplicate_responses += 1;
            return;
        }
        let flags = opcode.flags();
        if opcode == Opcode::RC_ACKNOWLEDGE {
            let Some(aeth) = f.aeth() else {
                self.cnt.bad_responses += 1;
                return;
            };
            match aeth.kind() {
                AethKind::Ack { .. } => {
                    self.cnt.acks_rcvd += 1;
                    self.on_ack(ctx, psn);
                }
                AethKind::Nak(NakCode::PsnSeqErr) => {
                    self.cnt.nak_psn_seq_rcvd += 1;
                    self.on_psn_seq_nak(ctx, psn);
                }
                AethKind::RnrNak { timer } => {
                    self.cnt.rnr_nak_rcvd += 1;
                    self.on_rnr_nak(ctx, psn, timer);
                }
                AethKind::Nak(code) => {
                    self.cnt.nak_fatal_rcvd += 1;
                    let status = match code {
                        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                        NakCode::RemoteAccessErr => WcStatus::RemAccessErr,
                        _ => WcStatus::RemOpErr,
                    };
                    self.ack_before(ctx, psn);
                    if self.state == QpState::Err {
                        return;
                    }
                    // The error belongs to the WQE whose request the NAK names. A READ/atomic before it (the NAK
                    // acknowledges it, but its response data was lost) cannot complete: it is flushed, as for a
                    // local error (fail_local), never reported with the other WR's remote error.
                    let idx = self.wqe_holding(psn);
                    self.fail_local(ctx, idx, status);
                }
                AethKind::Reserved(_) => self.cnt.bad_responses += 1,
            }
        } else if flags & op::READ != 0 && flags & op::RESP != 0 {
            self.on_read_response(ctx, f);
        } else if opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE {
            self.on_atomic_ack(ctx, f);
        } else {
            self.cnt.bad_responses += 1;
        }
    }

    /// The SEND/WRITE WQE at the head, if started; None if the head is a READ/atomic or nothing is outstanding.
    #[inline]
    fn head_started(&self) -> Option<super::SendWqe> {
        if self.sq.head == self.sq.tail {
            return None;
        }
        let w = *self.sq.get(self.sq.head);
        (w.state == WqeState::Started).then_some(w)
    }

    /// Completes every SEND/WRITE WQE whose packets all precede `psn`; stops at an outstanding READ/atomic.
    /// Returns true if comp_psn moved.
    fn ack_before(&mut self, ctx: &mut Ctx<'_>, psn: Psn) -> bool {
        let before = self.comp_psn;
        while self.sq.head != self.sq.tail {
            let w = self.sq.get(self.sq.head);
            if w.state != WqeState::Started || w.wr.opcode.is_rd_atomic() {
                break;
            }
            if !w.last_psn.before(psn) {
                // Within a partly acknowledged SEND/WRITE, everything before psn is acknowledged.
                if psn.after(self.comp_psn) {
                    self.comp_psn = psn;
                }
                break;
            }
            // (`counted` is only ever set on a READ/atomic, which the test above stopped at.)
            if !w.wr.signaled {
                self.retire_unsignaled(psn);
                continue;
            }
            self.comp_psn = w.last_psn.add(1);
            self.retire_head(ctx, WcStatus::Success);
            if self.state == QpState::Err {
                return true;
            }
        }
        let moved = self.comp_psn != before;
        // A late ACK may acknowledge packets a rewind had queued again: never resend below comp_psn.
        if self.req_psn.before(self.comp_psn) {
            self.reposition();
        }
        if moved {
            self.progress(ctx);
        }
        moved
    }

    /// The run of unsignaled SEND/WRITE WQEs at the head whose packets all precede `psn`: retired without a
    /// completion, a few loads and compares each (a coalesced ACK covers many of them). Stops at anything else:
    /// a signaled WQE (its completion), a READ/atomic, one counted against max_rd_atomic, one not wholly acked.
    #[inline(always)]
    fn retire_unsignaled(&mut self, psn: Psn) {
        let mut head = self.sq.head;
        let mut last = None;
        while head != self.sq.tail {
            let w = self.sq.get(head);
            // Not a READ/atomic, so not counted against max_rd_atomic (the requester counts only those).
            let plain = w.state == WqeState::Started && !w.wr.opcode.is_rd_atomic() && !w.wr.signaled;
            if !plain || !w.last_psn.before(psn) {
                break;
            }
            last = Some(w.last_psn);
            head = head.wrapping_add(1);
        }
        if let Some(l) = last {
            self.sq.head = head;
            self.comp_psn = l.add(1);
            self.keep_req_cur_at_head();
        }
    }

    /// The requester never points behind the head: after the head moved, `req_cur` moves up to it if it was passed.
    #[inline(always)]
    fn keep_req_cur_at_head(&mut self) {
        if self.req_cur.wrapping_sub(self.sq.head) > self.sq.tail.wrapping_sub(self.sq.head) {
            self.req_cur = self.sq.head;
        }
    }

    /// The index of the started WQE whose PSNs include `psn` (the head if none does).
    fn wqe_holding(&self, psn: Psn) -> u32 {
        let mut i = self.sq.head;
        while i != self.sq.tail {
            let w = self.sq.get(i);
            if w.state != WqeState::Started {
                break;
            }
            if !w.last_psn.before(psn) {
                return i;
            }
            i = i.wrapping_add(1);
        }
        self.sq.head
    }

    /// True if the head is a started READ/atomic whose PSNs all precede `psn`: a response for `psn` means the
    /// responder executed it and its own responses were lost (ROCE-NOTES §1.4).
    #[inline]
    fn beyond_pending_rd_atomic(&self, psn: Psn) -> bool {
        self.head_started().is_some_and(|w| w.wr.opcode.is_rd_atomic() && psn.after(w.last_psn))
    }

    /// A positive ACK for `psn`: everything up to and including it is acknowledged.
    fn on_ack(&mut self, ctx: &mut Ctx<'_>, psn: Psn) {
        let next = psn.add(1);
        self.ack_before(ctx, next);
        if self.state == QpState::Err {
            return;
        }
        // An ACK covering part of an outstanding READ/atomic means its responses were lost: go back.
        if let Some(w) = self.head_started() {
            if w.wr.opcode.is_rd_atomic() && !psn.before(w.first_psn) {
                self.retry(ctx, false);
            }
        }
    }

    fn on_psn_seq_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn) {
        // The responder expects `psn`: everything before it arrived (C9-...: a NAK implies an ACK of earlier PSNs).
        self.ack_before(ctx, psn);
        if self.state == QpState::Err {
            return;
        }
        // An RNR NAK already sent the requester back to comp_psn, to resend when its timer ends: a sequence NAK for
        // that PSN during the wait (rxe's responder sends one for the next packet of the message) reports no new
        // loss and spends no transport retry (ROCE-NOTES §1.4: retry_cnt counts transport retries, rnr_retry RNRs).
        if self.rnr_until.is_some() && psn == self.comp_psn {
            return;
        }
        self.retry(ctx, false);
    }

    fn on_rnr_nak(&mut self, ctx: &mut Ctx<'_>, psn: Psn, timer: u8) {
        self.ack_before(ctx, psn);
        if self.state == QpState::Err {
            return;
        }
        if self.beyond_pending_rd_atomic(psn) {
            // Not this WQE's RNR: the READ/atomic before it was executed and its responses lost. Go back to it at
            // once (rxe check_psn -> retry); its RNR retries are not spent on, or failed for, another WQE.
            self.retry(ctx, false);
            return;
        }
        if self.rnr_left == 0 {
            self.fail_head(ctx, WcStatus::RnrRetryExcErr);
            return;
        }
        // rnr_retry = 7 means retry forever.
        if self.rnr_retry != 7 {
            self.rnr_left -= 1;
        }
        let wait = Duration::from_micros(u64::from(RNR_TIMER_US[usize::from(timer & 0x1f)]));
        let until = ctx.now + wait;
        self.rnr_until = Some(until);
        self.timers.set(TimerKind::Rnr, until);
        self.timers.stop(TimerKind::Retransmit);
        self.rewind();
    }

    fn on_read_response(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) {
        let psn = f.bth().psn;
        let flags = f.bth().opcode.flags();
        if let Some(aeth) = f.aeth() {
            if !matches!(aeth.kind(), AethKind::Ack { .. }) {
                self.cnt.bad_responses += 1;
                return;
            }
        }
        self.ack_before(ctx, psn);
        if self.state == QpState::Err {
            return;
        }
        if self.beyond_pending_rd_atomic(psn) {
            // A response to a later READ: the pending READ/atomic's own responses were lost (rxe check_psn).
            self.retry(ctx, false);
            return;
        }
        let Some(w) = self.head_started() else {
            self.cnt.bad_responses += 1;
            return;
        };
        if w.wr.opcode != crate::verbs::WrOpcode::RdmaRead || psn.before(w.first_psn) || psn.after(w.last_psn) {
            self.unexpected_response(ctx, &w, psn);
            return;
        }
        if psn != self.comp_psn {
            // Earlier responses of this READ were lost.
            self.retry(ctx, false);
            return;
        }
        let off = self.psn_offset(&w, psn);
        let expect = (w.length - off).min(u64::from(self.mtu)) as usize;
        let is_last = psn == w.last_psn;
        let shape_ok = if is_last { flags & op::LAST != 0 } else { flags & op::LAST == 0 };
        if f.payload.len() != expect || !shape_ok {
            self.cnt.bad_responses += 1;
            self.fail_head(ctx, WcStatus::BadRespErr);
            return;
        }
        let idx = self.sq.head;
        if !f.payload.is_empty() && self.scatter_sq(idx, off, f.payload, ctx.mrs).is_err() {
            self.fail_head(ctx, WcStatus::LocProtErr);
            return;
        }
        self.comp_psn = psn.add(1);
        self.progress(ctx);
        if is_last {
            self.retire_head(ctx, WcStatus::Success);
        }
    }

    fn on_atomic_ack(&mut self, ctx: &mut Ctx<'_>, f: &RxFrame<'_>) {
        let psn = f.bth().psn;
        let (Some(aeth), Some(orig)) = (f.aeth(), f.atomic_ack()) else {
            self.cnt.bad_responses += 1;
            return;
        };
        if !matches!(aeth.kind(), AethKind::Ack { .. }) {
            self.cnt.bad_responses += 1;
            return;
        }
        self.ack_before(ctx, psn);
        if self.state == QpState::Err {
            return;
        }
        let Some(w) = self.head_started() else {
            self.cnt.bad_responses += 1;
            return;
        };
        if !w.wr.opcode.is_atomic() || w.first_psn != psn {
            if w.wr.opcode.is_rd_atomic() && psn.after(w.last_psn) {
                // Beyond a pending READ/atomic: its responses were lost (as for an ACK or READ response).
                self.retry(ctx, false);
            } else {
                self.unexpected_response(ctx, &w, psn);
            }
            return;
        }
        let idx = self.sq.head;
        if self.scatter_sq(idx, 0, &orig.to_le_bytes(), ctx.mrs).is_err() {
            self.fail_head(ctx, WcStatus::LocProtErr);
            return;
        }
        self.comp_psn = psn.add(1);
        self.progress(ctx);
        self.retire_head(ctx, WcStatus::Success);
    }

    /// A READ response or atomic ACK that does not answer the head WQE. One whose PSN is one of the head's own
    /// PSNs is the wrong response for that request (an ATOMIC_ACKNOWLEDGE at an outstanding READ's PSN, a READ
    /// response at an atomic's or a SEND/WRITE's): an unexpected transport opcode from the responder, which fails
    /// the WQE with IBV_WC_BAD_RESP_ERR and moves the QP to ERR (rxe `check_ack` fails the WQE and errors the QP
    /// the same way). Anything else (no head started, a PSN outside it) is counted and dropped.
    fn unexpected_response(&mut self, ctx: &mut Ctx<'_>, w: &super::SendWqe, psn: Psn) {
        self.cnt.bad_responses += 1;
        if !psn.before(w.first_psn) && !psn.after(w.last_psn) {
            self.fail_head(ctx, WcStatus::BadRespErr);
        }
    }

    /// Forward progress: retry counters reset (rxe `reset_retry_counters`), the retransmit timer restarts if
    /// anything is still outstanding.
    fn progress(&mut self, ctx: &mut Ctx<'_>) {
        // Responses to packets sent before a go-back-N may complete READs/atomics beyond the PSN the requester
        // restarted from: it must never resend (or number new WQEs) below comp_psn.
        if self.req_psn.before(self.comp_psn) {
            self.reposition();
        }
        self.retry_at = None;
        self.retry_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.rearm_retransmit(ctx);
    }

    /// Restarts or stops the local ACK timer depending on whether packets are outstanding.
    pub(crate) fn rearm_retransmit(&mut self, ctx: &mut Ctx<'_>) {
        if self.comp_psn != self.req_max_psn && self.state != QpState::Err {
            if let Some(t) = self.ack_timeout() {
                self.timers.set(TimerKind::Retransmit, ctx.now + t);
            }
        } else {
            self.timers.stop(TimerKind::Retransmit);
        }
    }

    /// Go back to comp_psn, counting a transport retry. `timeout` says whether the local ACK timer fired.
    pub(crate) fn retry(&mut self, ctx: &mut Ctx<'_>, timeout: bool) {
        if timeout {
            self.cnt.retry_timeouts += 1;
        } else if self.retry_at == Some(self.comp_psn) {
            // A go-back-N from this PSN is already under way: later responses that imply the same loss must not
            // start another (rxe `started_retry`); the retransmit timer remains the backstop.
            return;
        }
        self.retry_at = Some(self.comp_psn);
        let forever = self.retry_cnt == 7 && ctx.cfg.retry_cnt_7_infinite;
        if self.retry_left == 0 && !forever {
            self.fail_head(ctx, WcStatus::RetryExcErr);
            return;
        }
        if !forever {
            self.retry_left -= 1;
        }
        self.rewind();
        if let Some(t) = self.ack_timeout() {
            // At the end of representable time `now + t` saturates to `now`: a deadline already due would run this
            // retry again at once, for ever when retries are unlimited (handle_timeout would never return).
            let at = ctx.now + t;
            if at > ctx.now {
                self.timers.set(TimerKind::Retransmit, at);
            }
        }
    }

    /// Local ACK timeout fired.
    pub(crate) fn on_retransmit_timeout(&mut self, ctx: &mut Ctx<'_>) {
        if !self.requester_active() || self.comp_psn == self.req_max_psn {
            return;
        }
        self.retry(ctx, true);
    }

    /// Removes the head WQE, generating its completion if signaled or failed. Inline (a coalesced ACK retires
    /// many WQEs in a row); the completion is out of line.
    #[inline(always)]
    pub(crate) fn retire_head(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        let w = self.sq.get(self.sq.head);
        let (counted, signaled, opcode, length, wr_id) = (w.counted, w.wr.signaled, w.wr.opcode, w.length, w.wr.wr_id);
        self.sq.head = self.sq.head.wrapping_add(1);
        if counted {
            self.outstanding_rd_atomic = self.outstanding_rd_atomic.saturating_sub(1);
        }
        self.keep_req_cur_at_head();
        if signaled || status != WcStatus::Success {
            self.send_completion(ctx, wr_id, opcode, length, status);
        }
    }

    /// The completion of a retired send WQE.
    #[inline(never)]
    fn send_completion(
        &mut self,
        ctx: &mut Ctx<'_>,
        wr_id: u64,
        opcode: crate::verbs::WrOpcode,
        length: u64,
        status: WcStatus,
    ) {
        let byte_len = if opcode == crate::verbs::WrOpcode::RdmaRead { length as u32 } else { 0 };
        let cqe = Cqe {
            wr_id,
            status,
            opcode: opcode.wc_opcode(),
            qpn: self.qpn,
            byte_len,
            imm: None,
            invalidated_rkey: None,
            solicited: false,
        };
        self.cnt.send_completions += 1;
        let cq = self.send_cq;
        if !ctx.push_cqe(cq, cqe) {
            self.cnt.cq_overflows += 1;
            if self.state != QpState::Err {
                self.enter_error(ctx);
            }
        }
    }

    /// Completes the head WQE with an error status and moves the QP to the error state.
    pub(crate) fn fail_head(&mut self, ctx: &mut Ctx<'_>, status: WcStatus) {
        if self.sq.head != self.sq.tail {
            self.retire_head(ctx, status);
        }
        if self.state != QpState::Err {
            self.enter_error(ctx);
        }
    }

    /// Moves to the error state: every outstanding send and receive WQE completes with WR_FLUSH_ERR, timers stop.
    /// Queued acknowledgements (a NAK that explains the error, atomic results) still leave; READ response data does
    /// not (a QP in ERR sends no more data, as rxe's responder stops serving reads there).
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        self.state = QpState::Err;
        self.flush_pending_ack();
        self.out.retain(|o| !matches!(o, RespOut::Read { .. }));
        self.timers.stop(TimerKind::Retransmit);
        self.timers.stop(TimerKind::Rnr);
        self.timers.stop(TimerKind::AckCoalesce);
        // No data frame leaves in ERR: the rate controller's timer and the pacer's have no work. The connection is
        // gone, so a CNP queued before the error is dropped too (the engine ignores CNPs for a QP in ERR and sends
        // none for one).
        self.timers.stop(TimerKind::Cc);
        self.timers.stop(TimerKind::Pace);
        self.np.reset();
        self.rnr_until = None;
        while self.sq.head != self.sq.tail {
            self.flush_head(ctx);
        }
        self.req_cur = self.sq.head;
        self.outstanding_rd_atomic = 0;
        self.flush_rq(ctx);
    }

    /// Removes the head send WQE with a WR_FLUSH_ERR completion.
    fn flush_head(&mut self, ctx: &mut Ctx<'_>) {
        let w = *self.sq.get(self.sq.head);
        self.sq.head = self.sq.head.wrapping_add(1);
        let cqe = Cqe {
            wr_id: w.wr.wr_id,
            status: WcStatus::WrFlushErr,
            opcode: w.wr.opcode.wc_opcode(),
            qpn: self.qpn,
            byte_len: 0,
            imm: None,
            invalidated_rkey: None,
            solicited: false,
        };
        self.cnt.send_completions += 1;
        if !ctx.push_cqe(self.send_cq, cqe) {
            self.cnt.cq_overflows += 1;
        }
    }

    /// The requester found WQE `idx` invalid (a local error): the WQEs before it still in flight are flushed, `idx`
    /// completes with `status`, and the QP moves to the error state. The error is reported on the WR that caused
    /// it, never on an earlier one.
    pub(crate) fn fail_local(&mut self, ctx: &mut Ctx<'_>, idx: u32, status: WcStatus) {
        while self.sq.head != idx && self.sq.head != self.sq.tail {
            self.flush_head(ctx);
        }
        self.fail_head(ctx, status);
    }

    /// Completes every receive WQE with WR_FLUSH_ERR.
    pub(crate) fn flush_rq(&mut self, ctx: &mut Ctx<'_>) {
        while self.rq.head != self.rq.tail {
            let r = *self.rq.get(self.rq.head);
            self.rq.head = self.rq.head.wrapping_add(1);
            let cqe = Cqe {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: crate::verbs::WcOpcode::Recv,
                qpn: self.qpn,
                byte_len: 0,
                imm: None,
                invalidated_rkey: None,
                solicited: false,
            };
            self.cnt.recv_completions += 1;
            if !ctx.push_cqe(self.recv_cq, cqe) {
                self.cnt.cq_overflows += 1;
            }
        }
    }
}
