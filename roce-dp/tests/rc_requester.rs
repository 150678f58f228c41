//! Scripted requester/completer tests with explicit time: the local QP sends, the remote responder is a script of
//! ACKs, NAKs, READ responses and atomic ACKs. Covers segmentation and AckReq, each completer branch (ACK, partial
//! ACK, stale and bogus responses, PSN-sequence NAK, the fatal NAKs, RNR NAK, READ responses in and out of order,
//! atomic ACKs, ACKs implying lost READ responses), local ACK timeout and retry exhaustion, RNR back-off and
//! exhaustion, the window and max_rd_atomic limits, and the PSN wrap at 2^24.

mod harness;

use harness::*;
use roce_dp::wire::{AethRepr, NakCode, Opcode};
use roce_dp::{Duration, QpState, WcOpcode, WcStatus};

const S: u32 = 0x10_0000; // PeerCfg::default().sq_psn
const RVA: u64 = 0x7f00_0000_1000; // the remote's region
const RKEY: u32 = 0x1234;

fn ops(v: &[Out]) -> Vec<(Opcode, u32, bool)> {
    v.iter().map(|o| (o.op(), o.psn(), o.repr.bth.ack_req)).collect()
}

// ---------------------------------------------------------------------------------------------------- requests

#[test]
fn send_is_segmented_by_mtu_with_ack_req_on_the_last_packet() {
    let mut p = Peer::new();
    p.fill_data();
    p.post_send(1, 100, 2500);
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![
            (Opcode::RC_SEND_FIRST, S, false),
            (Opcode::RC_SEND_MIDDLE, S + 1, false),
            (Opcode::RC_SEND_LAST, S + 2, true)
        ],
        "{}",
        show(&v)
    );
    let all: Vec<u8> = v.iter().flat_map(|o| o.payload.clone()).collect();
    assert_eq!(&all[..], &p.data()[100..2600]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_psn, S + 3);
    assert_eq!(p.deadline(), Some(p.now + p.cfg.ack_timeout()), "the local ACK timer runs");
    p.rx(ack(S + 2, 1));
    let c = p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(c[0].opcode, WcOpcode::Send);
    assert_eq!(p.deadline(), None, "nothing outstanding: timer stopped");
    p.tx_nothing();
}

#[test]
fn write_carries_reth_on_the_first_packet_only() {
    let mut p = Peer::new();
    p.post_write(1, 0, 2048, RVA, RKEY);
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_WRITE_FIRST, S, false), (Opcode::RC_RDMA_WRITE_LAST, S + 1, true)]);
    assert_eq!(v[0].reth(), roce_dp::wire::RethRepr { va: RVA, rkey: RKEY, len: 2048 });
    assert!(v[1].repr.ext.reth.is_none());
}

#[test]
fn ack_req_is_also_set_every_n_packets_inside_a_long_message() {
    let mut p = Peer::with(PeerCfg { mtu: 256, ack_req_every: 4, ..PeerCfg::default() });
    p.post_send(1, 0, 10 * 256);
    let v = p.tx();
    let with_ack: Vec<u32> = v.iter().filter(|o| o.repr.bth.ack_req).map(|o| o.psn() - S).collect();
    assert_eq!(with_ack, vec![3, 7, 9], "{}", show(&v));
}

/// The region check of a WQE with one SGE (made once when the requester takes it, and for a SEND/WRITE of one
/// packet also the check of that packet's payload read): at the region's edges, in another PD, without the right
/// a READ needs, and after the region was deregistered, each WR leaves whole or completes with LOC_PROT_ERR and
/// sends nothing.
#[test]
fn a_one_sge_wr_is_checked_against_its_region_edges_once() {
    let end = DATA_LEN as u64;
    let send = |wr_id| roce_dp::SendWr::new(wr_id, roce_dp::WrOpcode::Send);
    let write = |wr_id| roce_dp::SendWr::new(wr_id, roce_dp::WrOpcode::RdmaWrite).remote(RVA, RKEY);
    // Within the region, up to its last byte: one packet (one MTU at most) and several, with the region's bytes.
    for (wr, off, len) in [(write(1), end - 100, 100u32), (send(2), 0, 1024), (write(3), end - 9000, 9000)] {
        let mut p = Peer::new();
        let pkts = len.div_ceil(p.cfg.mtu) as usize;
        p.fill_data();
        let s = p.sge(off, len);
        p.post(wr, &[s]);
        let v = p.tx();
        assert_eq!(v.len(), pkts, "{}", show(&v));
        let all: Vec<u8> = v.iter().flat_map(|o| o.payload.clone()).collect();
        assert_eq!(&all[..], &p.data()[off as usize..(off + u64::from(len)) as usize]);
        p.rx(ack(S + pkts as u32 - 1, 1));
        p.expect_cqes(&[(wr.wr_id, WcStatus::Success)]);
        assert_eq!(p.counters().tx_local_access_errors, 0);
    }
    // One byte past either end, one packet or several; READ into a region without LOCAL_WRITE (a guard).
    let bad: [(roce_dp::SendWr, i64, u32); 6] = [
        (write(1), end as i64 - 99, 100),
        (send(2), -1, 64),
        (send(3), end as i64 - 1023, 1024),
        (write(4), end as i64 - 8999, 9000),
        (roce_dp::SendWr::new(5, roce_dp::WrOpcode::RdmaRead).remote(RVA, RKEY), -64, 64),
        (write(6), end as i64, 1),
    ];
    for (wr, off, len) in bad {
        let mut p = Peer::new();
        let s = roce_dp::Sge { addr: DATA_VA.wrapping_add_signed(off), len, lkey: p.data.lkey };
        let s = if wr.opcode == roce_dp::WrOpcode::RdmaRead { roce_dp::Sge { lkey: p.guards[0].lkey, ..s } } else { s };
        p.post(wr, &[s]);
        p.tx_nothing();
        p.expect_cqes(&[(wr.wr_id, WcStatus::LocProtErr)]);
        assert_eq!(p.state(), QpState::Err, "{wr:?}");
        p.assert_guards();
    }
    // A region of another PD, and the region deregistered after the post.
    let mut p = Peer::new();
    let other = p.eng.alloc_pd();
    let k = p.eng.reg_mr(other, 0x90_0000, 4096, roce_dp::AccessFlags::ALL).unwrap();
    p.post(write(7), &[roce_dp::Sge { addr: 0x90_0000, len: 64, lkey: k.lkey }]);
    p.tx_nothing();
    p.expect_cqes(&[(7, WcStatus::LocProtErr)]);
    let mut p = Peer::new();
    let k = p.eng.reg_mr(p.pd, 0x90_0000, 4096, roce_dp::AccessFlags::ALL).unwrap();
    p.post(send(8), &[roce_dp::Sge { addr: 0x90_0000, len: 64, lkey: k.lkey }]);
    assert!(p.eng.dereg_mr(k.lkey));
    p.tx_nothing();
    p.expect_cqes(&[(8, WcStatus::LocProtErr)]);
}

#[test]
fn one_ack_completes_every_message_before_it_in_order() {
    let mut p = Peer::new();
    for i in 1..=3 {
        p.post_send(i, 0, 100);
    }
    let v = p.tx();
    assert_eq!(v.len(), 3);
    assert!(v.iter().all(|o| o.op() == Opcode::RC_SEND_ONLY && o.repr.bth.ack_req));
    p.rx(ack(S + 2, 3));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
}

#[test]
fn partial_ack_inside_a_message_completes_nothing_and_restarts_the_timer() {
    let mut p = Peer::new();
    p.post_send(1, 0, 3000);
    assert_eq!(p.tx().len(), 3);
    p.advance(Duration::from_micros(500));
    let t_ack = p.now;
    p.rx(ack(S + 1, 0));
    p.no_cqes();
    // The local ACK timer restarts at the ACK: nothing at the first deadline, the unacknowledged packet (only it)
    // again one timeout after the ACK.
    let due = t_ack + p.cfg.ack_timeout();
    p.advance_to(Instant(due.0 - 1));
    p.tx_nothing();
    p.advance_to(due);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_LAST, S + 2, true)]);
    p.rx(ack(S + 2, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
}

#[test]
fn stale_and_bogus_responses_are_counted_and_ignored() {
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    p.post_send(2, 0, 10);
    p.tx();
    p.rx(ack(S, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    p.rx(ack(S, 1)); // stale
    p.rx(ack(S + 2, 2)); // never sent
    p.rx(ack(S.wrapping_sub(1 << 22), 2)); // far behind
    p.rx(Pkt::new(Opcode::RC_ACKNOWLEDGE, S + 1).aeth(0x80, 2)); // reserved syndrome
    p.no_cqes();
    p.tx_nothing();
    let c = p.counters();
    assert_eq!(c.duplicate_responses, 2, "{c:?}");
    // A READ response at the SEND's PSN is no longer ignored: tests/audit_completer.rs (BAD_RESP_ERR).
    assert_eq!(c.bad_responses, 2, "{c:?}");
    assert_eq!(p.state(), QpState::Rts);
    p.rx(ack(S + 1, 2));
    p.expect_cqes(&[(2, WcStatus::Success)]);
}

// ---------------------------------------------------------------------------------------------------- NAKs

#[test]
fn psn_sequence_nak_acks_what_came_before_and_goes_back_n() {
    let mut p = Peer::new();
    for i in 1..=3 {
        p.post_send(i, 0, 100);
    }
    let first = p.tx();
    p.rx(nak(S + 1, NakCode::PsnSeqErr, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_SEND_ONLY, S + 1, true), (Opcode::RC_SEND_ONLY, S + 2, true)], "{}", show(&v));
    // A retransmission is the same frame apart from the IP ID (and so the IPv4 checksum).
    assert_eq!(with_ip_id(&v[0].raw, ip_id(&first[1].raw)), first[1].raw);
    // A second NAK for the same PSN while that go-back-N is under way starts no second one.
    p.rx(nak(S + 1, NakCode::PsnSeqErr, 1));
    p.tx_nothing();
    p.rx(ack(S + 2, 3));
    p.expect_cqes(&[(2, WcStatus::Success), (3, WcStatus::Success)]);
    let c = p.counters();
    assert_eq!((c.nak_psn_seq_rcvd, c.retransmitted_packets), (2, 2), "{c:?}");
}

fn fatal_nak(code: NakCode, want: WcStatus) {
    let mut p = Peer::new();
    p.post_send(1, 0, 100);
    p.post_send(2, 0, 100);
    p.post_send(3, 0, 100);
    p.tx();
    p.rx(nak(S + 1, code, 1));
    // Everything before the NAK PSN completed; the NAKed WR carries the error; the rest is flushed.
    p.expect_cqes(&[(1, WcStatus::Success), (2, want), (3, WcStatus::WrFlushErr)]);
    assert_eq!(p.state(), QpState::Err);
    assert_eq!(p.deadline(), None);
    p.tx_nothing();
}

#[test]
fn nak_invalid_request_completes_with_rem_inv_req_err() {
    fatal_nak(NakCode::InvalidRequest, WcStatus::RemInvReqErr);
}

#[test]
fn nak_remote_access_completes_with_rem_access_err() {
    fatal_nak(NakCode::RemoteAccessErr, WcStatus::RemAccessErr);
}

#[test]
fn nak_remote_operational_completes_with_rem_op_err() {
    fatal_nak(NakCode::RemoteOpErr, WcStatus::RemOpErr);
}

#[test]
fn nak_invalid_rd_request_completes_with_rem_op_err() {
    // ROCE-NOTES §4.3: 0x63 and other codes map to REM_OP_ERR.
    fatal_nak(NakCode::InvalidRdRequest, WcStatus::RemOpErr);
}

// ---------------------------------------------------------------------------------------------------- RNR

#[test]
fn rnr_nak_waits_the_encoded_time_then_resends() {
    // Timer code 14 = 1.28 ms, 4 = 40 µs (IBTA table, ROCE-NOTES §4.4).
    let mut p = Peer::with(PeerCfg { rnr_retry: 7, ..PeerCfg::default() });
    p.post_send(1, 0, 100);
    p.post_send(2, 0, 100);
    assert_eq!(p.tx().len(), 2);
    for (code, us) in [(14u8, 1280u64), (4, 40), (0, 655_360), (31, 491_520)] {
        p.advance(Duration::from_micros(3));
        let t0 = p.now;
        p.rx(rnr_nak(S, code, 0));
        p.tx_nothing();
        let d = t0 + Duration::from_micros(us);
        assert_eq!(p.deadline(), Some(d), "RNR timer code {code}");
        p.advance_to(Instant(d.0 - 1));
        p.tx_nothing();
        p.advance_to(d);
        let v = p.tx();
        assert_eq!(ops(&v), vec![(Opcode::RC_SEND_ONLY, S, true), (Opcode::RC_SEND_ONLY, S + 1, true)], "{}", show(&v));
    }
    p.no_cqes();
    p.rx(ack(S + 1, 2));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.counters().rnr_nak_rcvd, 4);
}

use roce_dp::Instant;

#[test]
fn rnr_nak_after_some_packets_completes_those_first() {
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    p.post_send(2, 0, 10);
    p.tx();
    p.rx(rnr_nak(S + 1, 1, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    p.advance(Duration::from_micros(10));
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S + 1, true)]);
}

#[test]
fn rnr_retry_exhaustion_completes_with_rnr_retry_exc_err() {
    let mut p = Peer::with(PeerCfg { rnr_retry: 2, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.post_send(2, 0, 10);
    p.tx();
    for _ in 0..2 {
        p.rx(rnr_nak(S, 1, 0));
        p.advance(Duration::from_micros(10));
        assert_eq!(p.tx().len(), 2);
    }
    p.rx(rnr_nak(S, 1, 0));
    p.expect_cqes(&[(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.state(), QpState::Err);
    p.advance(Duration::from_millis(100));
    p.tx_nothing();
}

#[test]
fn rnr_retry_zero_fails_at_the_first_rnr_nak() {
    let mut p = Peer::with(PeerCfg { rnr_retry: 0, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx();
    p.rx(rnr_nak(S, 1, 0));
    p.expect_cqes(&[(1, WcStatus::RnrRetryExcErr)]);
}

// ---------------------------------------------------------------------------------------------------- timeout

#[test]
fn local_ack_timeout_is_4096ns_times_2_pow_timeout_and_retries_are_exhausted() {
    let cfg = PeerCfg { timeout: 8, retry_cnt: 3, ..PeerCfg::default() };
    let mut p = Peer::with(cfg);
    let t = Duration::from_nanos(4096 << 8);
    p.post_send(1, 0, 2000);
    p.post_send(2, 0, 10);
    assert_eq!(p.tx().len(), 3);
    for n in 1..=3 {
        let d = p.deadline().expect("timer armed");
        assert_eq!(d, Instant(t.0 * n), "timeout {n} at n * 4.096 µs * 2^8");
        p.advance_to(Instant(d.0 - 1));
        p.tx_nothing();
        p.advance_to(d);
        let v = p.tx();
        assert_eq!(
            ops(&v),
            vec![
                (Opcode::RC_SEND_FIRST, S, false),
                (Opcode::RC_SEND_LAST, S + 1, true),
                (Opcode::RC_SEND_ONLY, S + 2, true)
            ],
            "retry {n}: {}",
            show(&v)
        );
        p.no_cqes();
    }
    p.fire();
    p.expect_cqes(&[(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.state(), QpState::Err);
    assert_eq!(p.deadline(), None);
    p.tx_nothing();
    assert_eq!(p.counters().retry_timeouts, 4);
}

#[test]
fn progress_resets_the_retry_counter() {
    let mut p = Peer::with(PeerCfg { retry_cnt: 1, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.post_send(2, 0, 10);
    p.tx();
    p.fire();
    assert_eq!(p.tx().len(), 2);
    p.rx(ack(S, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    // retry_cnt = 1 again: one more timeout retransmits, the second fails.
    p.fire();
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S + 1, true)]);
    p.fire();
    p.expect_cqes(&[(2, WcStatus::RetryExcErr)]);
}

#[test]
fn retry_cnt_zero_fails_at_the_first_timeout() {
    let mut p = Peer::with(PeerCfg { retry_cnt: 0, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx();
    p.fire();
    p.tx_nothing();
    p.expect_cqes(&[(1, WcStatus::RetryExcErr)]);
}

#[test]
fn timeout_zero_means_no_timer() {
    let mut p = Peer::with(PeerCfg { timeout: 0, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx();
    assert_eq!(p.deadline(), None);
}

#[test]
fn sequence_naks_count_against_retry_cnt() {
    let mut p = Peer::with(PeerCfg { retry_cnt: 2, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx();
    p.rx(nak(S, NakCode::PsnSeqErr, 0));
    assert_eq!(p.tx().len(), 1, "the NAK retry (1 of 2)");
    p.rx(nak(S, NakCode::PsnSeqErr, 0)); // the same go-back-N: no second retry
    p.tx_nothing();
    p.fire();
    assert_eq!(p.tx().len(), 1, "the timeout retry (2 of 2)");
    p.no_cqes();
    p.fire();
    p.tx_nothing();
    p.expect_cqes(&[(1, WcStatus::RetryExcErr)]);
}

// ---------------------------------------------------------------------------------------------------- READ / atomic

#[test]
fn read_responses_are_placed_and_complete_the_read() {
    let mut p = Peer::new();
    p.post_read(1, 0x100, 2500, RVA, RKEY);
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.repr.bth.ack_req), (Opcode::RC_RDMA_READ_REQUEST, S, true));
    assert_eq!(o.reth(), roce_dp::wire::RethRepr { va: RVA, rkey: RKEY, len: 2500 });
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_psn, S + 3, "a READ reserves one PSN per response packet");
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, S + 1).fill(1024, 1024));
    p.no_cqes();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 2).aeth(AethRepr::ACK_UNLIMITED, 1).fill(2048, 452));
    let c = p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!((c[0].opcode, c[0].byte_len), (WcOpcode::RdmaRead, 2500));
    let want: Vec<u8> = (0..2500).map(pattern).collect();
    assert_eq!(&p.data()[0x100..0x100 + 2500], &want[..]);
    assert!(p.data()[..0x100].iter().chain(&p.data()[0x100 + 2500..]).all(|&b| b == 0));
    p.assert_guards();
}

#[test]
fn lost_read_response_makes_the_requester_ask_again_from_there() {
    let mut p = Peer::new();
    p.post_read(1, 0, 2500, RVA, RKEY);
    p.tx();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 1024));
    // S+1 lost.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 2).aeth(AethRepr::ACK_UNLIMITED, 1).fill(2048, 452));
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn()), (Opcode::RC_RDMA_READ_REQUEST, S + 1), "{o}");
    assert_eq!(o.reth(), roce_dp::wire::RethRepr { va: RVA + 1024, rkey: RKEY, len: 2500 - 1024 });
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S + 1).aeth(AethRepr::ACK_UNLIMITED, 1).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 2).aeth(AethRepr::ACK_UNLIMITED, 1).fill(2048, 452));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    let want: Vec<u8> = (0..2500).map(pattern).collect();
    assert_eq!(&p.data()[..2500], &want[..]);
}

#[test]
fn ack_beyond_an_outstanding_read_means_its_responses_were_lost() {
    let mut p = Peer::new();
    p.post_read(1, 0, 2048, RVA, RKEY);
    p.post_send(2, 0, 10);
    assert_eq!(p.tx().len(), 2);
    p.rx(ack(S + 2, 2));
    p.no_cqes();
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![(Opcode::RC_RDMA_READ_REQUEST, S, true), (Opcode::RC_SEND_ONLY, S + 2, true)],
        "{}",
        show(&v)
    );
}

#[test]
fn read_response_of_the_wrong_length_is_a_bad_response() {
    let mut p = Peer::new();
    p.post_read(1, 0, 100, RVA, RKEY);
    p.post_send(2, 0, 10);
    p.tx();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 96));
    p.expect_cqes(&[(1, WcStatus::BadRespErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.state(), QpState::Err);
}

#[test]
fn read_response_that_ends_too_early_is_a_bad_response() {
    let mut p = Peer::new();
    p.post_read(1, 0, 2048, RVA, RKEY);
    p.tx();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 1024));
    p.expect_cqes(&[(1, WcStatus::BadRespErr)]);
}

#[test]
fn atomic_ack_writes_the_original_value_and_completes() {
    let mut p = Peer::new();
    p.post_fetch_add(1, 0x40, RVA, RKEY, 3);
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.repr.bth.ack_req), (Opcode::RC_FETCH_ADD, S, true));
    let a = o.repr.ext.atomic_eth.unwrap();
    assert_eq!((a.va, a.rkey, a.swap_add, a.compare), (RVA, RKEY, 3, 0));
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S).aeth(AethRepr::ACK_UNLIMITED, 1).atomic_ack(0x1122_3344_5566_7788));
    let c = p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(c[0].opcode, WcOpcode::FetchAdd);
    assert_eq!(u64::from_le_bytes(p.data()[0x40..0x48].try_into().unwrap()), 0x1122_3344_5566_7788);
}

#[test]
fn compare_and_swap_puts_swap_and_compare_in_the_atomic_eth() {
    let mut p = Peer::new();
    let mut wr = roce_dp::SendWr::new(1, roce_dp::WrOpcode::AtomicCmpSwp).remote(RVA, RKEY);
    wr.compare_add = 5;
    wr.swap = 9;
    p.post(wr, &[p.sge(0, 8)]);
    let a = p.tx_one().repr.ext.atomic_eth.unwrap();
    assert_eq!((a.swap_add, a.compare), (9, 5));
}

#[test]
fn ack_past_an_atomic_makes_it_retry_and_a_replayed_result_completes_it() {
    let mut p = Peer::new();
    p.post_fetch_add(1, 0, RVA, RKEY, 1);
    p.post_send(2, 0, 10);
    assert_eq!(p.tx().len(), 2);
    p.rx(ack(S + 1, 2));
    let v = p.tx();
    assert_eq!(ops(&v)[0], (Opcode::RC_FETCH_ADD, S, true), "{}", show(&v));
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S).aeth(AethRepr::ACK_UNLIMITED, 1).atomic_ack(41));
    p.rx(ack(S + 1, 2));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(u64::from_le_bytes(p.data()[..8].try_into().unwrap()), 41);
}

// ---------------------------------------------------------------------------------------------------- limits

#[test]
fn max_rd_atomic_limits_outstanding_reads() {
    let mut p = Peer::with(PeerCfg { max_rd_atomic: 2, ..PeerCfg::default() });
    for i in 0..3 {
        p.post_read(i, i * 64, 64, RVA, RKEY);
    }
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_READ_REQUEST, S, true), (Opcode::RC_RDMA_READ_REQUEST, S + 1, true)]);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 64));
    p.expect_cqes(&[(0, WcStatus::Success)]);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_RDMA_READ_REQUEST, S + 2, true)]);
}

/// Requests of whole messages (a SEND/WRITE of one packet, a READ), taken with the window open and with it
/// closed (the WQE then waits, started, for the window): each leaves once, in order, with its PSNs, opcode,
/// AckReq, SE, extension headers and payload, the READ's PSNs covering its three response packets.
#[test]
fn whole_message_requests_keep_psns_and_headers_when_the_window_holds_them() {
    use roce_dp::{SendWr, WrOpcode};
    let mut p = Peer::with(PeerCfg { max_unacked_psns: 2, ..PeerCfg::default() });
    p.fill_data();
    let mut w1 = SendWr::new(1, WrOpcode::RdmaWriteWithImm).remote(RVA, RKEY);
    w1.imm = 0x1111_2222;
    p.post(w1, &[p.sge(0, 100)]);
    let mut w2 = SendWr::new(2, WrOpcode::SendWithInv);
    (w2.invalidate_rkey, w2.solicited) = (0x4321, true);
    p.post(w2, &[p.sge(100, 64)]);
    p.post_read(3, 4096, 3000, RVA + 0x1000, RKEY);
    p.post_send(4, 200, 1024);
    p.post_write(5, 300, 1, RVA + 0x2000, RKEY);
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, S, true), (Opcode::RC_SEND_ONLY_WITH_INVALIDATE, S + 1, true)],
        "{}",
        show(&v)
    );
    assert_eq!(v[0].reth(), roce_dp::wire::RethRepr { va: RVA, rkey: RKEY, len: 100 });
    assert_eq!((v[0].repr.ext.imm, v[0].repr.bth.solicited), (Some(0x1111_2222), false));
    assert_eq!((v[1].repr.ext.ieth, v[1].repr.bth.solicited), (Some(0x4321), true));
    assert_eq!((&v[0].payload[..], &v[1].payload[..]), (&p.data()[..100], &p.data()[100..164]));
    // The READ was taken (PSNs S+2..=S+4) as the window closed.
    p.rx(ack(S + 1, 2));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_READ_REQUEST, S + 2, true)], "{}", show(&v));
    assert_eq!(v[0].reth(), roce_dp::wire::RethRepr { va: RVA + 0x1000, rkey: RKEY, len: 3000 });
    assert!(v[0].payload.is_empty());
    // The one-MTU SEND was taken as the window was closed by the READ.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S + 2).aeth(AethRepr::ACK_UNLIMITED, 3).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, S + 3).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 4).aeth(AethRepr::ACK_UNLIMITED, 3).fill(2048, 952));
    p.expect_cqes(&[(3, WcStatus::Success)]);
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_SEND_ONLY, S + 5, true), (Opcode::RC_RDMA_WRITE_ONLY, S + 6, true)]);
    assert_eq!((&v[0].payload[..], &v[1].payload[..]), (&p.data()[200..1224], &p.data()[300..301]));
    assert_eq!(v[1].reth(), roce_dp::wire::RethRepr { va: RVA + 0x2000, rkey: RKEY, len: 1 });
    p.rx(ack(S + 6, 5));
    p.expect_cqes(&[(4, WcStatus::Success), (5, WcStatus::Success)]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_psn, S + 7);
    p.tx_nothing();
}

#[test]
fn fence_waits_for_earlier_reads() {
    let mut p = Peer::new();
    p.post_read(1, 0, 64, RVA, RKEY);
    let mut wr = roce_dp::SendWr::new(2, roce_dp::WrOpcode::Send);
    wr.fence = true;
    p.post(wr, &[p.sge(0, 8)]);
    assert_eq!(p.tx().len(), 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 64));
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S + 1, true)]);
}

#[test]
fn the_unacknowledged_window_stops_the_requester() {
    let mut p = Peer::with(PeerCfg { mtu: 256, max_unacked_psns: 4, ..PeerCfg::default() });
    p.post_send(1, 0, 8 * 256);
    assert_eq!(p.tx().len(), 4);
    p.rx(ack(S + 1, 0));
    let v = p.tx();
    assert_eq!(v.iter().map(|o| o.psn()).collect::<Vec<_>>(), vec![S + 4, S + 5]);
}

// ---------------------------------------------------------------------------------------------------- PSN wrap

#[test]
fn send_across_the_psn_wrap_and_nak_after_it() {
    let mut p = Peer::with(PeerCfg { sq_psn: 0xff_fffe, ..PeerCfg::default() });
    p.post_send(1, 0, 4000);
    p.post_send(2, 0, 10);
    let v = p.tx();
    assert_eq!(v.iter().map(|o| o.psn()).collect::<Vec<_>>(), vec![0xff_fffe, 0xff_ffff, 0, 1, 2]);
    p.rx(ack(0xff_ffff, 0));
    p.no_cqes();
    p.rx(nak(2, NakCode::PsnSeqErr, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, 2, true)]);
    p.rx(ack(2, 2));
    p.expect_cqes(&[(2, WcStatus::Success)]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_psn, 3);
}

#[test]
fn read_across_the_psn_wrap() {
    let mut p = Peer::with(PeerCfg { sq_psn: 0xff_ffff, ..PeerCfg::default() });
    p.post_read(1, 0, 2048, RVA, RKEY);
    assert_eq!(p.tx_one().psn(), 0xff_ffff);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, 0xff_ffff).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, 0).aeth(AethRepr::ACK_UNLIMITED, 1).fill(1024, 1024));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_psn, 1);
}

#[test]
fn atomic_completed_by_a_response_to_its_first_transmission_after_a_rewind_does_not_stall_the_next_wr() {
    // The NAK at S+1 rewinds the requester to S+1 (the FETCH_ADD); the ATOMIC ACK of the first transmission then
    // completes it. The requester must continue at S+2 with the WR the window held back, not at the old S+1 (where
    // the window check would leave it idle with no timer armed: a stuck QP, found by the fuzz test).
    let mut p = Peer::with(PeerCfg { max_unacked_psns: 2, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.post_fetch_add(2, 0x100, RVA, RKEY, 1);
    p.post_send(3, 0, 10);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S, true), (Opcode::RC_FETCH_ADD, S + 1, true)]);
    p.rx(nak(S + 1, NakCode::PsnSeqErr, 1));
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S + 1).aeth(AethRepr::ACK_UNLIMITED, 2).atomic_ack(7));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S + 2, true)]);
    p.rx(ack(S + 2, 3));
    p.expect_cqes(&[(3, WcStatus::Success)]);
}

#[test]
fn retry_cnt_7_is_finite_but_rnr_retry_7_is_infinite() {
    // IBA: only rnr_retry = 7 means "retry forever" (ROCE-NOTES §4.6); rxe also treats retry_cnt = 7 as infinite
    // (§1.4), this engine follows the IBA and qib/hfi1 there.
    let mut p = Peer::with(PeerCfg { retry_cnt: 7, rnr_retry: 7, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx();
    for _ in 0..50 {
        p.rx(rnr_nak(S, 1, 0));
        p.advance(Duration::from_micros(10));
        assert_eq!(p.tx().len(), 1);
    }
    p.no_cqes();
    for n in 0..7 {
        p.fire();
        assert_eq!(p.tx().len(), 1, "timeout retry {n}");
    }
    p.fire();
    p.expect_cqes(&[(1, WcStatus::RetryExcErr)]);
}

#[test]
fn acks_with_any_credit_count_are_acks() {
    let mut p = Peer::new();
    for i in 1..=3 {
        p.post_send(i, 0, 10);
    }
    p.tx();
    p.rx(Pkt::new(Opcode::RC_ACKNOWLEDGE, S).aeth(0x00, 1));
    p.rx(Pkt::new(Opcode::RC_ACKNOWLEDGE, S + 1).aeth(0x0a, 2));
    p.rx(Pkt::new(Opcode::RC_ACKNOWLEDGE, S + 2).aeth(0x1e, 3));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success), (3, WcStatus::Success)]);
}

#[test]
fn immediate_and_invalidate_ride_on_the_last_packet() {
    let mut p = Peer::new();
    let mut wr = roce_dp::SendWr::new(1, roce_dp::WrOpcode::SendWithImm);
    wr.imm = 0x0102_0304;
    p.post(wr, &[p.sge(0, 1500)]);
    let mut wr = roce_dp::SendWr::new(2, roce_dp::WrOpcode::SendWithInv);
    wr.invalidate_rkey = 0xabcd;
    p.post(wr, &[p.sge(0, 10)]);
    let mut wr = roce_dp::SendWr::new(3, roce_dp::WrOpcode::RdmaWriteWithImm).remote(RVA, RKEY);
    wr.imm = 9;
    p.post(wr, &[p.sge(0, 10)]);
    let v = p.tx();
    let got: Vec<(Opcode, Option<u32>, Option<u32>)> =
        v.iter().map(|o| (o.op(), o.repr.ext.imm, o.repr.ext.ieth)).collect();
    assert_eq!(
        got,
        vec![
            (Opcode::RC_SEND_FIRST, None, None),
            (Opcode::RC_SEND_LAST_WITH_IMMEDIATE, Some(0x0102_0304), None),
            (Opcode::RC_SEND_ONLY_WITH_INVALIDATE, None, Some(0xabcd)),
            (Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, Some(9), None),
        ],
        "{}",
        show(&v)
    );
}

#[test]
fn zero_length_read_takes_one_psn_and_completes_on_an_empty_response() {
    let mut p = Peer::new();
    p.post_read(1, 0, 0, RVA, RKEY);
    let o = p.tx_one();
    assert_eq!(o.reth().len, 0);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_psn, S + 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1));
    let c = p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(c[0].byte_len, 0);
}

#[test]
fn read_response_carrying_a_nak_syndrome_is_ignored() {
    let mut p = Peer::new();
    p.post_read(1, 0, 64, RVA, RKEY);
    p.tx();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(0x62, 1).fill(0, 64));
    p.no_cqes();
    assert_eq!(p.counters().bad_responses, 1);
    assert!(p.data()[..64].iter().all(|&b| b == 0), "a refused response was placed");
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 64));
    p.expect_cqes(&[(1, WcStatus::Success)]);
}

#[test]
fn read_into_a_region_deregistered_meanwhile_is_a_local_protection_error() {
    let mut p = Peer::new();
    let t = p.eng.reg_mr(p.pd, 0x90_0000, 4096, roce_dp::AccessFlags::ALL).unwrap();
    p.post(
        roce_dp::SendWr::new(1, roce_dp::WrOpcode::RdmaRead).remote(RVA, RKEY),
        &[roce_dp::Sge { addr: 0x90_0000, len: 64, lkey: t.lkey }],
    );
    p.tx();
    assert!(p.eng.dereg_mr(t.lkey));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 64));
    p.expect_cqes(&[(1, WcStatus::LocProtErr)]);
    assert_eq!(p.state(), QpState::Err);
    p.assert_guards();
}

#[test]
fn atomic_ack_for_a_later_atomic_means_the_earlier_result_was_lost() {
    let mut p = Peer::new();
    p.post_fetch_add(1, 0, RVA, RKEY, 1);
    p.post_fetch_add(2, 8, RVA, RKEY, 1);
    assert_eq!(p.tx().len(), 2);
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S + 1).aeth(AethRepr::ACK_UNLIMITED, 2).atomic_ack(5));
    p.no_cqes();
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_FETCH_ADD, S, true), (Opcode::RC_FETCH_ADD, S + 1, true)], "{}", show(&v));
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S).aeth(AethRepr::ACK_UNLIMITED, 1).atomic_ack(4));
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S + 1).aeth(AethRepr::ACK_UNLIMITED, 2).atomic_ack(5));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(u64::from_le_bytes(p.data()[..8].try_into().unwrap()), 4);
    assert_eq!(u64::from_le_bytes(p.data()[8..16].try_into().unwrap()), 5);
}

#[test]
fn retry_cnt_7_retries_forever_when_configured_as_rxe() {
    let mut p = Peer::with(PeerCfg { retry_cnt: 7, retry_cnt_7_infinite: true, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx();
    for n in 0..40 {
        p.fire();
        assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S, true)], "timeout retry {n}");
    }
    p.no_cqes();
    assert_eq!(p.state(), QpState::Rts);
    // Any other retry_cnt stays finite with the option on.
    let mut p = Peer::with(PeerCfg { retry_cnt: 6, retry_cnt_7_infinite: true, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx();
    for _ in 0..6 {
        p.fire();
        assert_eq!(p.tx().len(), 1);
    }
    p.fire();
    p.expect_cqes(&[(1, WcStatus::RetryExcErr)]);
}

#[test]
fn a_send_is_gathered_from_its_sges_across_packet_boundaries() {
    let mut p = Peer::new();
    p.fill_data();
    let sgl = [p.sge(0x100, 1000), p.sge(0x4000, 30), p.sge(0x8000, 500)];
    p.post(roce_dp::SendWr::new(1, roce_dp::WrOpcode::Send), &sgl);
    let v = p.tx();
    assert_eq!(v.iter().map(|o| o.payload.len()).collect::<Vec<_>>(), vec![1024, 506]);
    let all: Vec<u8> = v.iter().flat_map(|o| o.payload.clone()).collect();
    let d = p.data();
    let want: Vec<u8> = [&d[0x100..0x100 + 1000], &d[0x4000..0x4000 + 30], &d[0x8000..0x8000 + 500]].concat();
    assert_eq!(all, want);
}

#[test]
fn inline_data_is_copied_at_post_time() {
    let mut p = Peer::new();
    p.fill_data();
    let mut wr = roce_dp::SendWr::new(1, roce_dp::WrOpcode::Send);
    wr.inline = true;
    p.post(wr, &[p.sge(0, 64)]);
    let want = p.data()[..64].to_vec();
    p.data_mut()[..64].fill(0xee); // the buffer is reused at once
    let o = p.tx_one();
    assert_eq!(o.payload, want);
    // Across retransmissions too.
    p.fire();
    assert_eq!(p.tx_one().payload, want);
}

// ---------------------------------------------------------------------------------------------------- differential

/// The requester's fast paths (a WR with one non-empty SGE: `sole_packet` for a SEND/WRITE of one packet,
/// `read_request` for a READ, the payload read through the check's span) against the general path: the same WRs
/// posted to a second, identical QP with the same bytes as that SGE followed by an empty one (two SGEs: the
/// general path, validate_sgl and the gather) give byte-identical frames and the same completions, over random
/// opcodes (SEND, with immediate, with invalidate, WRITE, with immediate, READ), lengths (0 to 3 MTUs), SE,
/// fences, windows, max_rd_atomic, AckReq spacing and a start near the PSN wrap, with ACKs at random PSNs sent
/// (READs passed over: re-requested), sequence NAKs (go-back-N into messages the fast path sent), first READ
/// responses (a READ then resumed mid-message), local ACK timeouts and the region deregistered and registered
/// again (WRs posted with its old key fail, later ones read the new one) in between.
#[test]
fn one_sge_fast_paths_send_what_the_general_path_sends_over_random_wrs() {
    use roce_dp::sim::SimRng;
    use roce_dp::{SendWr, WrOpcode};
    const OPS: [WrOpcode; 6] = [
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::SendWithInv,
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead,
    ];
    let mut frames = 0usize;
    for seed in 1..=60u64 {
        let mut rng = SimRng::new(seed);
        let cfg = PeerCfg {
            mtu: 256,
            sq_psn: if rng.below(2) == 0 { 0xff_fff0 } else { S },
            max_unacked_psns: 2 + rng.below(10) as u32,
            max_rd_atomic: 1 + rng.below(3) as u8,
            ack_req_every: 1 + rng.below(4) as u32,
            ..PeerCfg::default()
        };
        let (mut a, mut b) = (Peer::with(cfg), Peer::with(cfg));
        a.fill_data();
        b.fill_data();
        let mut psns: Vec<u32> = Vec::new();
        let mut reads: Vec<(u32, u32)> = Vec::new();
        let mut wr_id = 0u64;
        let mut msn = 0u32;
        for step in 0..80 {
            match rng.below(8) {
                0..=3 => {
                    wr_id += 1;
                    let op = OPS[rng.below(OPS.len() as u64) as usize];
                    let len = match rng.below(4) {
                        0 => rng.below(3) as u32,
                        1 | 2 => 1 + rng.below(256) as u32,
                        _ => rng.below(3 * 256 + 1) as u32,
                    };
                    let off = rng.below(4096);
                    let mut wr = SendWr::new(wr_id, op).remote(RVA + rng.below(1 << 20), RKEY);
                    (wr.imm, wr.invalidate_rkey) = (rng.next_u64() as u32, rng.next_u64() as u32);
                    (wr.solicited, wr.fence) = (rng.below(2) == 0, rng.below(4) == 0);
                    let one = [a.sge(off, len)];
                    let two = [b.sge(off, len), b.sge(off + u64::from(len), 0)];
                    let ra = a.eng.post_send(a.qpn, &wr, &one).map_err(|e| e.to_string());
                    let rb = b.eng.post_send(b.qpn, &wr, &two).map_err(|e| e.to_string());
                    assert_eq!(ra, rb, "seed {seed} step {step}: post {wr:?}");
                }
                4 if !psns.is_empty() => {
                    let psn = psns[rng.below(psns.len() as u64) as usize];
                    msn += 1;
                    a.rx(ack(psn, msn));
                    b.rx(ack(psn, msn));
                }
                5 if !psns.is_empty() => {
                    let psn = psns[rng.below(psns.len() as u64) as usize];
                    a.rx(nak(psn, NakCode::PsnSeqErr, msn));
                    b.rx(nak(psn, NakCode::PsnSeqErr, msn));
                }
                6 if !reads.is_empty() => {
                    let (psn, len) = reads[rng.below(reads.len() as u64) as usize];
                    msn += 1;
                    let pkt = if len > 256 {
                        Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, psn).fill(0, 256)
                    } else {
                        Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn).fill(0, len as usize)
                    };
                    let pkt = pkt.aeth(AethRepr::ACK_UNLIMITED, msn);
                    a.rx(pkt.clone());
                    b.rx(pkt);
                }
                // The data region deregistered and registered again (its slot's next generation, zeroed): the
                // WRs posted with the old key fail, the later ones read the new region.
                7 if rng.below(3) == 0 => {
                    for p in [&mut a, &mut b] {
                        assert!(p.eng.dereg_mr(p.data.lkey));
                        p.data = p.eng.reg_mr(p.pd, DATA_VA, DATA_LEN, roce_dp::AccessFlags::ALL).unwrap();
                    }
                    assert_eq!(a.data, b.data);
                }
                _ => {
                    if let Some(t) = a.deadline() {
                        assert_eq!(b.deadline(), Some(t), "seed {seed} step {step}: timers");
                        a.advance_to(t);
                        b.advance_to(t);
                    }
                }
            }
            let (va, vb) = (a.tx(), b.tx());
            let raw = |v: &[Out]| v.iter().map(|o| o.raw.clone()).collect::<Vec<_>>();
            assert!(
                raw(&va) == raw(&vb),
                "seed {seed} step {step}:\nfast path:\n{}\ngeneral path:\n{}",
                show(&va),
                show(&vb)
            );
            for o in &va {
                psns.push(o.psn());
                if o.op() == Opcode::RC_RDMA_READ_REQUEST {
                    reads.push((o.psn(), o.reth().len));
                }
            }
            frames += va.len();
            let (ca, cb) = (a.cqes(), b.cqes());
            assert_eq!(ca, cb, "seed {seed} step {step}: completions");
            assert_eq!(a.state(), b.state(), "seed {seed} step {step}");
            assert_eq!(a.data(), b.data(), "seed {seed} step {step}: READ placement");
        }
    }
    assert!(frames > 1000, "the script sent {frames} frames");
}
