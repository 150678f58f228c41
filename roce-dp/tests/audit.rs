//! An independent audit of the RC engine against the facts of ROCE-NOTES §1.4-§1.6 and §4 (written from those facts,
//! not from the code): the responder's check order when several checks fail at once, PSN arithmetic at the 2^24
//! wrap in every comparison, MSN accounting, duplicate READ re-execution and the atomic replay ring, unsignaled WQE
//! retirement around errors, ACK coalescing, zero-length messages, SEND_WITH_INVALIDATE, bogus responses and QPs
//! outside RTS receiving frames. Every expected value is stated by the test from those facts.

mod harness;

use harness::*;
use roce_dp::wire::{AethKind, AethRepr, NakCode, Opcode};
use roce_dp::{AccessFlags, AckPolicy, Duration, QpAttr, QpState, SendWr, WcOpcode, WcStatus, WrOpcode};

/// The responder's first expected PSN (PeerCfg::default().rq_psn).
const R: u32 = 0x20_0000;
/// The requester's first PSN (PeerCfg::default().sq_psn).
const S: u32 = 0x10_0000;
const ACK: u8 = AethRepr::ACK_UNLIMITED;
const RVA: u64 = 0x7f00_0000_1000;
const RKEY: u32 = 0x1234;
const M: u32 = 0xff_ffff;

fn seq_nak() -> u8 {
    AethRepr::nak(NakCode::PsnSeqErr, 0).syndrome
}

fn u64_at(p: &Peer, off: usize) -> u64 {
    u64::from_le_bytes(p.data()[off..off + 8].try_into().unwrap())
}

fn ops(v: &[Out]) -> Vec<(Opcode, u32)> {
    v.iter().map(|o| (o.op(), o.psn())).collect()
}

/// An unsignaled RDMA WRITE of `len` bytes from the data region.
fn post_write_unsignaled(p: &mut Peer, wr_id: u64, len: u32) {
    let s = p.sge(0, len);
    let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWrite).remote(RVA, RKEY);
    wr.signaled = false;
    p.post(wr, &[s]);
}

// ============================================================================ responder: several checks fail at once
//
// ROCE-NOTES §1.6 / issue 4: PSN, op sequence, op valid, resources, length, rkey/bounds/access; the first failing
// check decides the response.

#[test]
fn psn_ahead_wins_over_every_other_check() {
    // Out of sequence AND a MIDDLE with no FIRST AND no receive WQE AND a bad length: the PSN check comes first, so
    // one PSN sequence error NAK (not fatal), nothing else.
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R + 1).fill(0, 7));
    p.expect_ack(R, seq_nak(), 0);
    assert_eq!(p.state(), QpState::Rts);
    p.no_cqes();
}

#[test]
fn duplicate_psn_wins_over_op_checks() {
    // A duplicate WRITE with a bad rkey and a bad length: duplicates are re-ACKed (C9-105), never checked again.
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, k, 4).fill(0, 4));
    p.expect_ack(R, ACK, 1);
    let snap = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, 0xbad0, 9).fill(0, 5));
    p.expect_ack(R, ACK, 1);
    assert_eq!(p.state(), QpState::Rts);
    assert!(p.data() == &snap[..]);
}

#[test]
fn op_sequence_wins_over_missing_receive_wqe_and_length() {
    // SEND_LAST between messages (op sequence), no receive WQE (RNR), zero payload (length): invalid request.
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R).ack_req());
    p.expect_nak(R, NakCode::InvalidRequest);
    assert_eq!(p.state(), QpState::Err);
}

#[test]
fn op_valid_wins_over_missing_receive_wqe_and_rkey() {
    // WRITE_ONLY_WITH_IMM on a QP without REMOTE_WRITE, no receive WQE, a bad rkey: invalid request, not RNR and
    // not remote access.
    let mut p = Peer::with(PeerCfg { access: AccessFlags::REMOTE_READ, ..PeerCfg::default() });
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, R).ack_req().reth(DATA_VA, 0xbad0, 4).imm(1).fill(0, 4));
    p.expect_nak(R, NakCode::InvalidRequest);
    assert_eq!(p.state(), QpState::Err);
}

#[test]
fn missing_receive_wqe_wins_over_length() {
    // SEND_FIRST shorter than the MTU with no receive WQE: check_resource comes before check_length, so an RNR NAK
    // (not fatal, the PSN not consumed).
    let mut p = Peer::with(PeerCfg { min_rnr_timer: 9, ..PeerCfg::default() });
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 100));
    p.expect_ack(R, 0x20 | 9, 0);
    assert_eq!(p.state(), QpState::Rts);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R);
}

#[test]
fn length_wins_over_rkey() {
    // ONLY longer than the MTU with a bad rkey, FIRST shorter than the MTU with a bad rkey, a READ longer than 2^31
    // with a bad rkey: all length errors (invalid request), not remote access errors.
    let mut p = Peer::with(PeerCfg { mtu: 256, ..PeerCfg::default() });
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, 0xbad0, 300).fill(0, 300));
    p.expect_nak(R, NakCode::InvalidRequest);
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, 0xbad0, 4000).fill(0, 1000));
    p.expect_nak(R, NakCode::InvalidRequest);
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, 0xbad0, 0x8000_0001));
    p.expect_nak(R, NakCode::InvalidRequest);
    assert_eq!(p.state(), QpState::Err);
}

#[test]
fn rkey_errors_for_each_operation_are_remote_access_naks() {
    // A bad rkey on WRITE, READ and each atomic: NAK remote access error (0x62), fatal, nothing executed.
    for pkt in [
        Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, 0xbad0, 8).fill(0, 8),
        Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, 0xbad0, 8),
        Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, 0xbad0, 1, 0),
        Pkt::new(Opcode::RC_COMPARE_SWAP, R).ack_req().atomic(DATA_VA, 0xbad0, 1, 0),
    ] {
        let mut p = Peer::new();
        let before = p.data().to_vec();
        p.rx(pkt);
        p.expect_nak(R, NakCode::RemoteAccessErr);
        assert_eq!(p.state(), QpState::Err);
        assert!(p.data() == &before[..]);
        assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R, "a refused request consumes no PSN");
    }
}

// ============================================================================ responder: PSN wrap at 2^24

#[test]
fn one_sequence_nak_per_gap_across_the_wrap() {
    let mut p = Peer::with(PeerCfg { rq_psn: M, ..PeerCfg::default() });
    for i in 0..3 {
        p.post_recv(i, 0, 64);
    }
    // Expected 0xffffff; 1 and 2 lie ahead across the wrap: one NAK naming 0xffffff, then silence.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, 1).ack_req().fill(0, 4));
    p.expect_ack(M, seq_nak(), 0);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, 2).ack_req().fill(0, 4));
    p.tx_nothing();
    // The expected PSN: accepted; then 0 is the next, a packet at 2 is a new gap.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, M).ack_req().fill(0, 4));
    p.expect_ack(M, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, 2).ack_req().fill(0, 4));
    p.expect_ack(0, seq_nak(), 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, 0).ack_req().fill(0, 4));
    p.expect_ack(0, ACK, 2);
    // 0xffffff is now a duplicate: re-ACKed with the PSN of the last accepted request (0).
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, M).ack_req().fill(0, 4));
    p.expect_ack(0, ACK, 2);
    assert_eq!(p.cqes().len(), 2);
}

#[test]
fn read_across_the_wrap_and_its_duplicate_from_a_mid_message_psn() {
    // A 3-packet READ at 0xfffffe takes 0xfffffe, 0xffffff and 0; the expected PSN becomes 1. A duplicate from
    // 0xffffff (the requester lost the responses from there) re-executes from memory: MIDDLE... no: a restarted
    // stream starts with FIRST at the requested PSN and ends with LAST at 0, with the original MSN.
    let mut p = Peer::with(PeerCfg { rq_psn: M - 1, ..PeerCfg::default() });
    p.fill_data();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, M - 1).ack_req().reth(DATA_VA + 8, k, 2100));
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, M - 1),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, M),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, 0)
        ],
        "{}",
        show(&v)
    );
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, 1);
    for b in &mut p.data_mut()[1024..2200] {
        *b = 0x77;
    }
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, M).ack_req().reth(DATA_VA + 8 + 1024, k, 2100 - 1024));
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![(Opcode::RC_RDMA_READ_RESPONSE_FIRST, M), (Opcode::RC_RDMA_READ_RESPONSE_LAST, 0)],
        "{}",
        show(&v)
    );
    assert_eq!(v[0].aeth().msn, 1);
    assert_eq!(v[1].aeth().msn, 1);
    let all: Vec<u8> = v.iter().flat_map(|o| o.payload.clone()).collect();
    assert_eq!(all.len(), 2100 - 1024);
    assert_eq!(&all[..], &p.data()[8 + 1024..8 + 2100]);
    // The last response alone (PSN 0, after the wrap).
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, 0).ack_req().reth(DATA_VA + 8 + 2048, k, 2100 - 2048));
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_READ_RESPONSE_ONLY, 0)], "{}", show(&v));
    assert_eq!(&v[0].payload[..], &p.data()[8 + 2048..8 + 2100]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, 1, "a duplicate moves nothing");
}

#[test]
fn atomic_replay_across_the_wrap() {
    let mut p = Peer::with(PeerCfg { rq_psn: M, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.data_mut()[..8].copy_from_slice(&100u64.to_le_bytes());
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, M).ack_req().atomic(DATA_VA, k, 1, 0));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, 0).ack_req().atomic(DATA_VA, k, 10, 0));
    let v = p.tx();
    let got: Vec<(u32, Option<u64>)> = v.iter().map(|o| (o.psn(), o.repr.ext.atomic_ack)).collect();
    assert_eq!(got, vec![(M, Some(100)), (0, Some(101))]);
    // Both again: replayed in order, not executed.
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, M).ack_req().atomic(DATA_VA, k, 1, 0));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, 0).ack_req().atomic(DATA_VA, k, 10, 0));
    let v = p.tx();
    let got: Vec<(u32, Option<u64>, u32)> = v.iter().map(|o| (o.psn(), o.repr.ext.atomic_ack, o.aeth().msn)).collect();
    assert_eq!(got, vec![(M, Some(100), 1), (0, Some(101), 2)]);
    assert_eq!(u64_at(&p, 0), 111);
}

#[test]
fn coalesced_ack_across_the_wrap_names_the_last_ack_requested_psn() {
    let ack = AckPolicy { max_pkts: 3, max_delay: Duration::from_micros(20) };
    let mut p = Peer::with(PeerCfg { ack, rq_psn: M - 1, ..PeerCfg::default() });
    let k = p.data.rkey;
    for (i, psn) in [M - 1, M, 0].into_iter().enumerate() {
        p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, psn).ack_req().reth(DATA_VA, k, 4).fill(0, 4));
        if i < 2 {
            p.tx_nothing();
        }
    }
    p.expect_ack(0, ACK, 3);
}

// ============================================================================ responder: MSN (ROCE-NOTES §1.5, §4.5)

#[test]
fn msn_counts_messages_only_not_duplicates_rnr_or_packets() {
    // MSN: +1 per completed SEND/WRITE message (at its last packet), +1 per READ/atomic at execution (C9-148); a
    // duplicate, an RNR NAK, a sequence NAK or a middle packet changes nothing.
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.post_recv(1, 0, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).ack_req().fill(0, 1024));
    p.expect_ack(R, ACK, 0);
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 1).ack_req().fill(1024, 10));
    p.expect_ack(R + 1, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 1).ack_req().fill(1024, 10)); // duplicate
    p.expect_ack(R + 1, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 4).ack_req().fill(0, 10)); // gap
    p.expect_ack(R + 2, seq_nak(), 1);
    // (The gap before the RNR NAK: after an RNR NAK the packets of its gap get no sequence NAK, audit_engine2.)
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 2).ack_req().fill(0, 10)); // no receive WQE: RNR
    p.expect_ack(R + 2, 0x20 | p.cfg.min_rnr_timer, 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 2).ack_req().reth(DATA_VA, k, 2048));
    let v = p.tx();
    assert_eq!(v.len(), 2);
    assert_eq!((v[0].aeth().msn, v[1].aeth().msn), (2, 2));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 4).ack_req().atomic(DATA_VA, k, 1, 0));
    assert_eq!(p.tx_one().aeth().msn, 3);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R + 5).ack_req().reth(DATA_VA, k, 1030).fill(0, 1024));
    p.expect_ack(R + 5, ACK, 3);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST, R + 6).ack_req().fill(0, 6));
    p.expect_ack(R + 6, ACK, 4);
    // A duplicate READ replays with its own MSN; a duplicate atomic with its own.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 3).ack_req().reth(DATA_VA + 1024, k, 1024));
    assert_eq!(p.tx_one().aeth().msn, 2);
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 4).ack_req().atomic(DATA_VA, k, 1, 0));
    assert_eq!(p.tx_one().aeth().msn, 3);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 7).ack_req().reth(DATA_VA, k, 1).fill(0, 1));
    p.expect_ack(R + 7, ACK, 5);
}

#[test]
fn coalesced_ack_before_a_read_carries_the_msn_of_its_own_psn() {
    // A held ACK for a SEND at R leaves when the READ at R+1 is executed, ahead of the READ's responses. The MSN
    // of an ACK counts the messages completed up to its PSN (ROCE-NOTES §1.5: rxe sends it at R with msn 1); the
    // READ, counted at its execution, is message 2 and its responses say so.
    let ack = AckPolicy { max_pkts: 8, max_delay: Duration::from_micros(100) };
    let mut p = Peer::with(PeerCfg { ack, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.post_recv(1, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.tx_nothing();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA, k, 16));
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_ACKNOWLEDGE, R), (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R + 1)], "{}", show(&v));
    assert_eq!(v[0].aeth(), AethRepr::ack(1), "ACK of R: one message completed by R");
    assert_eq!(v[1].aeth(), AethRepr::ack(2));
    // The same for an atomic.
    p.post_recv(2, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 2).ack_req().fill(0, 8));
    p.tx_nothing();
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 3).ack_req().atomic(DATA_VA + 64, k, 1, 0));
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_ACKNOWLEDGE, R + 2), (Opcode::RC_ATOMIC_ACKNOWLEDGE, R + 3)], "{}", show(&v));
    assert_eq!(v[0].aeth(), AethRepr::ack(3));
    assert_eq!(v[1].aeth(), AethRepr::ack(4));
}

#[test]
fn coalesced_ack_msn_matches_its_psn_when_a_later_message_had_no_ack_request() {
    // AckReq is the requester's choice; a SEND_ONLY without it completes a message that no ACK is due for. The
    // held ACK of R, sent at its deadline, still names R: its MSN must be R's (1), not one counting R+1.
    let ack = AckPolicy { max_pkts: 8, max_delay: Duration::from_micros(10) };
    let mut p = Peer::with(PeerCfg { ack, ..PeerCfg::default() });
    p.post_recv(1, 0, 64);
    p.post_recv(2, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 1).fill(0, 8));
    p.tx_nothing();
    p.advance(Duration::from_micros(10));
    let o = p.tx_one();
    assert_eq!(o.op(), Opcode::RC_ACKNOWLEDGE);
    assert_eq!((o.psn(), o.aeth().msn), (R, 1), "got {o}");
}

// ============================================================================ responder: the atomic / READ ring

#[test]
fn resource_ring_keeps_the_last_max_dest_rd_atomic_requests() {
    // max_dest_rd_atomic = 2: after READ R, atomics R+1 and R+2, the READ's resource is recycled: its duplicate is
    // dropped (ROCE-NOTES §1.6 "not found: drop"); the two atomics replay their saved results.
    let mut p = Peer::with(PeerCfg { max_dest_rd_atomic: 2, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.data_mut()[0x100..0x108].copy_from_slice(&7u64.to_le_bytes());
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 16));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 1).ack_req().atomic(DATA_VA + 0x100, k, 1, 0));
    p.rx(Pkt::new(Opcode::RC_COMPARE_SWAP, R + 2).ack_req().atomic(DATA_VA + 0x100, k, 50, 8));
    assert_eq!(p.tx().len(), 3);
    assert_eq!(u64_at(&p, 0x100), 50);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 16));
    p.tx_nothing();
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 1).ack_req().atomic(DATA_VA + 0x100, k, 1, 0));
    p.rx(Pkt::new(Opcode::RC_COMPARE_SWAP, R + 2).ack_req().atomic(DATA_VA + 0x100, k, 50, 8));
    let v = p.tx();
    let got: Vec<(u32, Option<u64>)> = v.iter().map(|o| (o.psn(), o.repr.ext.atomic_ack)).collect();
    assert_eq!(got, vec![(R + 1, Some(7)), (R + 2, Some(8))]);
    assert_eq!(u64_at(&p, 0x100), 50, "no atomic executed twice");
    // One more atomic recycles R+1's slot; its duplicate is then dropped, R+2's still replays.
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 3).ack_req().atomic(DATA_VA + 0x100, k, 1, 0));
    assert_eq!(p.tx_one().repr.ext.atomic_ack, Some(50));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 1).ack_req().atomic(DATA_VA + 0x100, k, 1, 0));
    p.tx_nothing();
    p.rx(Pkt::new(Opcode::RC_COMPARE_SWAP, R + 2).ack_req().atomic(DATA_VA + 0x100, k, 50, 8));
    assert_eq!(p.tx_one().repr.ext.atomic_ack, Some(8));
    assert_eq!(u64_at(&p, 0x100), 51);
    assert_eq!(p.state(), QpState::Rts);
}

#[test]
fn duplicate_atomic_with_no_saved_result_is_never_executed() {
    // More atomics outstanding than max_dest_rd_atomic (the requester's fault): the ring recycles, and a duplicate
    // of a recycled one is dropped rather than executed a second time.
    let mut p = Peer::with(PeerCfg { max_dest_rd_atomic: 1, ..PeerCfg::default() });
    let k = p.data.rkey;
    for i in 0..4 {
        p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + i).ack_req().atomic(DATA_VA, k, 1, 0));
    }
    assert_eq!(p.tx().len(), 4);
    for i in 0..3 {
        p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + i).ack_req().atomic(DATA_VA, k, 1, 0));
    }
    p.tx_nothing();
    assert_eq!(u64_at(&p, 0), 4);
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 3).ack_req().atomic(DATA_VA, k, 1, 0));
    assert_eq!(p.tx_one().repr.ext.atomic_ack, Some(3));
    assert_eq!(u64_at(&p, 0), 4);
}

// ============================================================================ responder: zero length, invalidate

#[test]
fn zero_length_messages_are_accepted_and_complete() {
    let mut p = Peer::new();
    p.post_recv(1, 0, 0);
    p.post_recv(2, 0, 64);
    // A zero-length SEND consumes a receive WQE (even one with no buffer) and completes with byte_len 0.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req());
    p.expect_ack(R, ACK, 1);
    // A zero-length WRITE with immediate needs no valid rkey (C9-88) but consumes a receive WQE.
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, R + 1).ack_req().reth(0, 0xdead, 0).imm(0xabcd));
    p.expect_ack(R + 1, ACK, 2);
    let c = p.cqes();
    assert_eq!(c.len(), 2, "{c:?}");
    assert_recv(&c[0], 1, 0);
    assert_eq!((c[1].wr_id, c[1].status, c[1].opcode), (2, WcStatus::Success, WcOpcode::RecvRdmaWithImm));
    assert_eq!((c[1].byte_len, c[1].imm), (0, Some(0xabcd)));
    // Without a receive WQE, a zero-length SEND is an RNR NAK like any SEND.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 2).ack_req());
    p.expect_ack(R + 2, 0x20 | p.cfg.min_rnr_timer, 2);
}

#[test]
fn zero_length_sends_and_writes_leave_as_one_empty_only_packet_and_complete() {
    let mut p = Peer::new();
    p.post(SendWr::new(1, WrOpcode::Send), &[]);
    p.post(SendWr::new(2, WrOpcode::RdmaWrite).remote(RVA, RKEY), &[]);
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_SEND_ONLY, S), (Opcode::RC_RDMA_WRITE_ONLY, S + 1)], "{}", show(&v));
    assert!(v.iter().all(|o| o.payload.is_empty() && o.repr.bth.ack_req));
    assert_eq!(v[1].reth().len, 0);
    p.rx(ack(S + 1, 2));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn an_invalidated_rkey_is_refused_for_read_and_atomic_too() {
    for later in [
        Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(0x90_0000, 0, 8),
        Pkt::new(Opcode::RC_FETCH_ADD, R + 1).ack_req().atomic(0x90_0000, 0, 1, 0),
    ] {
        let mut p = Peer::new();
        let t = p.eng.reg_mr(p.pd, 0x90_0000, 4096, AccessFlags::ALL).unwrap();
        p.post_recv(1, 0, 64);
        p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R).ack_req().ieth(t.rkey).fill(0, 8));
        p.expect_ack(R, ACK, 1);
        let mut later = later;
        if let Some(r) = later.ext.reth.as_mut() {
            r.rkey = t.rkey;
        }
        if let Some(a) = later.ext.atomic_eth.as_mut() {
            a.rkey = t.rkey;
        }
        p.rx(later);
        p.expect_nak(R + 1, NakCode::RemoteAccessErr);
        assert_eq!(p.state(), QpState::Err);
    }
}

#[test]
fn a_read_queued_before_its_region_is_invalidated_is_not_served() {
    // READ at R (two responses: R, R+1), then SEND_WITH_INVALIDATE at R+2 revoking the READ's rkey before the responses
    // left: no byte of the revoked region goes out; the responder NAKs with remote access error.
    let mut p = Peer::new();
    let t = p.eng.reg_mr(p.pd, 0x90_0000, 4096, AccessFlags::ALL).unwrap();
    p.eng.mr_bytes_mut(t.lkey).unwrap().fill(0x42);
    p.post_recv(1, 0, 64);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(0x90_0000, t.rkey, 2048));
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R + 2).ack_req().ieth(t.rkey).fill(0, 8));
    let v = p.tx();
    assert!(v.iter().all(|o| !o.payload.contains(&0x42)), "revoked bytes were sent: {}", show(&v));
    assert_eq!(v[0].op(), Opcode::RC_ACKNOWLEDGE, "{}", show(&v));
    assert_eq!(v[0].aeth().kind(), AethKind::Nak(NakCode::RemoteAccessErr));
    assert_eq!(p.state(), QpState::Err);
}

// ============================================================================ responder: QP states

#[test]
fn a_qp_in_err_answers_no_request_and_completes_nothing() {
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    p.post_recv(1, 0, 64);
    p.expect_cqes(&[(1, WcStatus::WrFlushErr)]);
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, k, 8).fill(0, 8));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 8));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 1, 0));
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 5).ack_req().fill(0, 8)); // a gap: no NAK from an ERR QP either
    p.rx(ack(S, 0));
    p.tx_nothing();
    p.no_cqes();
    assert!(p.data() == &before[..]);
    assert_eq!(p.deadline(), None);
}

#[test]
fn a_qp_that_enters_err_sends_no_more_read_response_data() {
    // A 4-packet READ (MTU 256) and an atomic are queued and nothing has left yet. Moved to ERR by the application:
    // the atomic's result (an executed operation) still leaves, the READ's data does not (rxe's responder stops
    // serving reads in ERR).
    let mut p = Peer::with(PeerCfg { mtu: 256, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 1000));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 4).ack_req().atomic(DATA_VA + 0x100, k, 1, 0));
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_ATOMIC_ACKNOWLEDGE, R + 4)], "{}", show(&v));
    // A fatal request error behind a queued READ: the NAK that explains it leaves, the READ's data does not.
    let mut p = Peer::with(PeerCfg { mtu: 256, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 1000));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 4).ack_req().reth(DATA_VA, k ^ 0x100, 8).fill(0, 8));
    p.expect_nak(R + 4, NakCode::RemoteAccessErr);
    assert_eq!(p.state(), QpState::Err);
    p.tx_nothing();
}

#[test]
fn a_qp_in_sqd_still_runs_its_responder() {
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Sqd), ..QpAttr::default() }).unwrap();
    p.post_recv(1, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.expect_ack(R, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA, k, 8));
    assert_eq!(p.tx_one().op(), Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    assert_recv(&p.cqes()[0], 1, 8);
}

// ============================================================================ completer: bogus responses

#[test]
fn ack_beyond_what_was_sent_is_ignored_across_the_wrap() {
    // Two packets sent at 0xfffffe and 0xffffff: an ACK naming 0 (never sent) or 5 is bogus and ignored; an ACK
    // of 0xffffff completes both.
    let mut p = Peer::with(PeerCfg { sq_psn: M - 1, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.post_send(2, 0, 10);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, M - 1), (Opcode::RC_SEND_ONLY, M)]);
    for bogus in [0, 5, 0x7f_0000] {
        p.rx(ack(bogus, 2));
        p.rx(nak(bogus, NakCode::RemoteAccessErr, 2));
        p.rx(nak(bogus, NakCode::PsnSeqErr, 2));
    }
    p.no_cqes();
    p.tx_nothing();
    assert_eq!(p.state(), QpState::Rts);
    p.rx(ack(M, 2));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
}

#[test]
fn window_of_unacked_psns_across_the_wrap() {
    let mut p = Peer::with(PeerCfg { sq_psn: M - 1, max_unacked_psns: 3, ..PeerCfg::default() });
    for i in 0..6 {
        p.post_send(i, 0, 10);
    }
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, M - 1), (Opcode::RC_SEND_ONLY, M), (Opcode::RC_SEND_ONLY, 0)]);
    p.rx(ack(M, 2));
    p.expect_cqes(&[(0, WcStatus::Success), (1, WcStatus::Success)]);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, 1), (Opcode::RC_SEND_ONLY, 2)]);
    // A sequence NAK at 1 (0 arrived) across the wrap: 2 completes, 1 and 2 are sent again.
    p.rx(nak(1, NakCode::PsnSeqErr, 3));
    p.expect_cqes(&[(2, WcStatus::Success)]);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, 1), (Opcode::RC_SEND_ONLY, 2), (Opcode::RC_SEND_ONLY, 3)]);
    p.rx(ack(3, 6));
    p.expect_cqes(&[(3, WcStatus::Success), (4, WcStatus::Success), (5, WcStatus::Success)]);
}

#[test]
fn read_responses_across_the_wrap_with_a_bad_psn_or_length_or_opcode() {
    // READ of 2100 B at 0xfffffe: responses 0xfffffe (FIRST), 0xffffff (MIDDLE), 0 (LAST).
    let mut p = Peer::with(PeerCfg { sq_psn: M - 1, ..PeerCfg::default() });
    p.post_read(1, 0x1000, 2100, RVA, RKEY);
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.reth().len), (Opcode::RC_RDMA_READ_REQUEST, M - 1, 2100));
    // A response for PSN 1 (beyond what was requested): ignored.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, 1).aeth(ACK, 1).fill(0, 52));
    p.no_cqes();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, M - 1).aeth(ACK, 1).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, M).fill(1024, 1024));
    p.no_cqes();
    // The LAST at 0 with the right length completes the READ with its byte count.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, 0).aeth(ACK, 1).fill(2048, 52));
    let c = p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!((c[0].opcode, c[0].byte_len), (WcOpcode::RdmaRead, 2100));
    let want: Vec<u8> = (0..2100).map(pattern).collect();
    assert_eq!(&p.data()[0x1000..0x1000 + 2100], &want[..]);
    assert_eq!(p.deadline(), None);
}

// ============================================================================ completer: unsignaled runs and errors

#[test]
fn fatal_nak_in_a_run_of_unsignaled_writes_completes_the_failed_one_then_flushes_in_order() {
    // W1, W2 unsignaled (one packet each), W3 unsignaled (3 packets), W4 signaled, W5 unsignaled. A remote access
    // NAK at W3's second packet: W1 and W2 retire silently (the NAK acknowledges what precedes it), W3 completes
    // with REM_ACCESS_ERR, W4 and W5 with WR_FLUSH_ERR, in this order (ROCE-NOTES §4.3).
    let mut p = Peer::new();
    post_write_unsignaled(&mut p, 1, 100);
    post_write_unsignaled(&mut p, 2, 100);
    post_write_unsignaled(&mut p, 3, 3000);
    p.post_write(4, 0, 10, RVA, RKEY);
    post_write_unsignaled(&mut p, 5, 10);
    assert_eq!(p.tx().len(), 7);
    p.rx(nak(S + 3, NakCode::RemoteAccessErr, 2));
    let c = p.expect_cqes(&[(3, WcStatus::RemAccessErr), (4, WcStatus::WrFlushErr), (5, WcStatus::WrFlushErr)]);
    assert!(c.iter().all(|c| c.opcode == WcOpcode::RdmaWrite));
    assert_eq!(p.state(), QpState::Err);
    p.tx_nothing();
    assert_eq!(p.deadline(), None);
}

#[test]
fn fatal_nak_at_the_first_packet_after_an_unsignaled_run_fails_that_wqe() {
    // NAK at W3's first PSN: W1, W2 retire silently, W3 gets the error.
    let mut p = Peer::new();
    post_write_unsignaled(&mut p, 1, 10);
    post_write_unsignaled(&mut p, 2, 10);
    p.post_write(3, 0, 10, RVA, RKEY);
    post_write_unsignaled(&mut p, 4, 10);
    p.tx();
    p.rx(nak(S + 2, NakCode::InvalidRequest, 2));
    p.expect_cqes(&[(3, WcStatus::RemInvReqErr), (4, WcStatus::WrFlushErr)]);
}

#[test]
fn rnr_retry_exhausted_inside_an_unsignaled_run() {
    let mut p = Peer::with(PeerCfg { rnr_retry: 0, ..PeerCfg::default() });
    post_write_unsignaled(&mut p, 1, 10);
    let s = p.sge(0, 10);
    let mut wr = SendWr::new(2, WrOpcode::Send);
    wr.signaled = false;
    p.post(wr, &[s]);
    post_write_unsignaled(&mut p, 3, 10);
    p.tx();
    p.rx(rnr_nak(S + 1, 1, 1));
    p.expect_cqes(&[(2, WcStatus::RnrRetryExcErr), (3, WcStatus::WrFlushErr)]);
}

#[test]
fn retry_exhausted_after_part_of_an_unsignaled_run_was_acked() {
    let mut p = Peer::with(PeerCfg { retry_cnt: 0, ..PeerCfg::default() });
    for i in 1..=4 {
        post_write_unsignaled(&mut p, i, 10);
    }
    p.tx();
    p.rx(ack(S + 1, 2));
    p.no_cqes();
    p.fire();
    p.expect_cqes(&[(3, WcStatus::RetryExcErr), (4, WcStatus::WrFlushErr)]);
}

#[test]
fn unsignaled_read_between_unsignaled_writes_completes_silently_in_order() {
    // W1 (unsignaled), READ 2 (unsignaled), W3 (unsignaled), W4 (signaled). An ACK of W3's PSN cannot retire the
    // READ (its data comes only in its response) nor anything after it; the READ response then retires READ 2 and
    // the later ACK retires W3 and W4: one completion, W4's.
    let mut p = Peer::new();
    post_write_unsignaled(&mut p, 1, 10);
    let s = p.sge(0x2000, 8);
    let mut rd = SendWr::new(2, WrOpcode::RdmaRead).remote(RVA, RKEY);
    rd.signaled = false;
    p.post(rd, &[s]);
    post_write_unsignaled(&mut p, 3, 10);
    p.post_write(4, 0, 10, RVA, RKEY);
    assert_eq!(p.tx().len(), 4);
    p.rx(ack(S, 1));
    p.no_cqes();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S + 1).aeth(ACK, 2).payload(&[9; 8]));
    p.no_cqes();
    assert_eq!(&p.data()[0x2000..0x2008], &[9; 8]);
    p.rx(ack(S + 3, 4));
    let c = p.expect_cqes(&[(4, WcStatus::Success)]);
    assert_eq!(c[0].opcode, WcOpcode::RdmaWrite);
    assert_eq!(p.deadline(), None);
    p.tx_nothing();
}

#[test]
fn a_local_error_after_an_unsignaled_run_reports_on_the_bad_wr() {
    // W1, W2 unsignaled and sent; W3 has an SGE outside any region: W1, W2 (in flight, never acknowledged) flush,
    // W3 completes with LOC_PROT_ERR, W4 flushes; in posting order.
    let mut p = Peer::new();
    post_write_unsignaled(&mut p, 1, 10);
    post_write_unsignaled(&mut p, 2, 10);
    p.tx();
    let bad = roce_dp::Sge { addr: 0xdead_0000, len: 8, lkey: p.data.lkey };
    p.post(SendWr::new(3, WrOpcode::Send), &[bad]);
    p.post_write(4, 0, 10, RVA, RKEY);
    p.tx_nothing();
    p.expect_cqes(&[
        (1, WcStatus::WrFlushErr),
        (2, WcStatus::WrFlushErr),
        (3, WcStatus::LocProtErr),
        (4, WcStatus::WrFlushErr),
    ]);
}

// ============================================================================ requester + responder: RNR mid-WRITE

#[test]
fn rnr_at_the_last_packet_of_a_write_with_immediate_resumes_there() {
    // The FIRST is placed, the LAST_WITH_IMM finds no receive WQE: RNR NAK at the LAST's PSN. The requester's
    // retry of that packet alone (the RNR NAK acknowledges the FIRST) completes the message.
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, k, 1100).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, R + 1).ack_req().imm(5).fill(1024, 76));
    p.expect_ack(R + 1, 0x20 | p.cfg.min_rnr_timer, 0);
    p.post_recv(1, 0x8000, 0);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, R + 1).ack_req().imm(5).fill(1024, 76));
    p.expect_ack(R + 1, ACK, 1);
    let c = p.cqes();
    assert_eq!((c[0].wr_id, c[0].status, c[0].byte_len, c[0].imm), (1, WcStatus::Success, 1100, Some(5)));
    let want: Vec<u8> = (0..1100).map(pattern).collect();
    assert_eq!(&p.data()[..1100], &want[..]);
}

// ============================================================================ ACK coalescing: deadline vs AckReq

#[test]
fn coalescing_deadline_runs_from_the_first_held_ack_and_only_ack_requests_arm_it() {
    // Packets without AckReq owe no ACK and arm nothing; the first AckReq'd packet starts the delay, later ones do
    // not extend it, and the ACK that leaves at the deadline names the newest AckReq'd PSN.
    let ack = AckPolicy { max_pkts: 10, max_delay: Duration::from_micros(50) };
    let mut p = Peer::with(PeerCfg { ack, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, k, 3000).fill(0, 1024));
    assert_eq!(p.deadline(), None, "no AckReq: no ACK due, no timer");
    p.advance(Duration::from_micros(5));
    let t0 = p.now;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).ack_req().fill(1024, 1024));
    assert_eq!(p.deadline(), Some(t0 + Duration::from_micros(50)));
    p.advance(Duration::from_micros(30));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST, R + 2).ack_req().fill(2048, 952));
    assert_eq!(p.deadline(), Some(t0 + Duration::from_micros(50)), "a later AckReq does not push the deadline");
    p.advance_to(t0 + Duration::from_nanos(49_999));
    p.tx_nothing();
    p.advance_to(t0 + Duration::from_micros(50));
    p.expect_ack(R + 2, ACK, 1);
    assert_eq!(p.deadline(), None);
    // A duplicate makes the responder answer at once, and a held ACK leaves ahead of it.
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 3).ack_req().reth(DATA_VA, k, 4).fill(0, 4));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 1).ack_req().reth(DATA_VA, k, 4).fill(0, 4));
    let v = p.tx();
    let got: Vec<(u32, u8, u32)> = v.iter().map(|o| (o.psn(), o.aeth().syndrome, o.aeth().msn)).collect();
    assert_eq!(got.last(), Some(&(R + 3, ACK, 2)), "{}", show(&v));
    assert_eq!(p.deadline(), None, "the held ACK's timer stops when it leaves");
}

#[test]
fn a_fatal_error_sends_the_held_ack_then_the_nak() {
    let ack = AckPolicy { max_pkts: 10, max_delay: Duration::from_micros(50) };
    let mut p = Peer::with(PeerCfg { ack, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, k, 4).fill(0, 4));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 1).ack_req().reth(DATA_VA, 0xbad0, 4).fill(0, 4));
    let v = p.tx();
    let got: Vec<(u32, u8)> = v.iter().map(|o| (o.psn(), o.aeth().syndrome)).collect();
    assert_eq!(got, vec![(R, ACK), (R + 1, AethRepr::nak(NakCode::RemoteAccessErr, 0).syndrome)], "{}", show(&v));
    assert_eq!(v[0].aeth().msn, 1);
    assert_eq!(p.state(), QpState::Err);
    assert_eq!(p.deadline(), None);
}

// ============================================================================ requester in SQD

#[test]
fn sqd_retransmits_a_started_wr_on_timeout_but_starts_no_new_one() {
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    assert_eq!(p.tx().len(), 1);
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Sqd), ..QpAttr::default() }).unwrap();
    p.post_send(2, 0, 10);
    p.tx_nothing();
    p.fire();
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S)]);
    p.rx(ack(S, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    p.tx_nothing();
    assert_eq!(p.deadline(), None);
}

// ============================================================================ completer: READ responses

#[test]
fn read_response_for_a_psn_of_another_wqe_is_ignored() {
    // SEND at S, READ at S+1..S+2. A READ response naming S (the SEND's PSN) is no response to the READ: the
    // READ still completes from its own responses.
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    p.post_read(2, 0x1000, 2048, RVA, RKEY);
    assert_eq!(p.tx().len(), 2);
    p.rx(ack(S, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(ACK, 1).fill(0, 10));
    p.no_cqes();
    assert_eq!(p.state(), QpState::Rts);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S + 1).aeth(ACK, 2).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 2).aeth(ACK, 2).fill(1024, 1024));
    let c = p.expect_cqes(&[(2, WcStatus::Success)]);
    assert_eq!(c[0].byte_len, 2048);
}

#[test]
fn a_lost_middle_read_response_restarts_the_read_from_there_with_the_remaining_length() {
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 3000, RVA, RKEY);
    p.tx_one();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(ACK, 1).fill(0, 1024));
    // S+1 lost; S+2 arrives: go back to S+1, asking for the rest (ROCE-NOTES §1.4: a READ resumes at
    // (length - resid) / mtu packets into the read).
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 2).aeth(ACK, 1).fill(2048, 952));
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn()), (Opcode::RC_RDMA_READ_REQUEST, S + 1));
    assert_eq!(o.reth(), roce_dp::wire::RethRepr { va: RVA + 1024, rkey: RKEY, len: 3000 - 1024 });
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S + 1).aeth(ACK, 1).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 2).aeth(ACK, 1).fill(2048, 952));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    let want: Vec<u8> = (0..3000).map(pattern).collect();
    assert_eq!(&p.data()[0x1000..0x1000 + 3000], &want[..]);
}

#[test]
fn an_atomic_ack_beyond_what_was_sent_is_ignored() {
    let mut p = Peer::new();
    p.post_fetch_add(1, 0x100, RVA, RKEY, 1);
    p.tx_one();
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S + 1).aeth(ACK, 1).atomic_ack(77));
    p.no_cqes();
    assert_eq!(p.state(), QpState::Rts);
    p.rx(Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, S).aeth(ACK, 1).atomic_ack(5));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(u64_at(&p, 0x100), 5);
}

// ============================================================================ two QPs: invalidation mid-WRITE

#[test]
fn a_write_in_progress_on_one_qp_stops_at_an_rkey_another_qp_invalidated() {
    // QP A is inside a 3-packet WRITE to region T when QP B receives a SEND_WITH_INVALIDATE of T's rkey: A's next
    // packet is refused (remote access NAK).
    let mut p = Peer::new();
    let t = p.eng.reg_mr(p.pd, 0x90_0000, 4096, AccessFlags::ALL).unwrap();
    let b = p.eng.create_qp(p.pd, p.scq, p.rcq, roce_dp::QpCaps::default()).unwrap();
    let a = p.qpn;
    p.qpn = b;
    p.bring_up();
    p.post_recv(1, 0, 64);
    p.qpn = a;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(0x90_0000, t.rkey, 2100).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R).dest_qp(b).ack_req().ieth(t.rkey).fill(0, 8));
    p.expect_ack(R, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).fill(1024, 1024));
    p.expect_nak(R + 1, NakCode::RemoteAccessErr);
    assert_eq!(p.state(), QpState::Err);
    assert!(p.eng.mr_bytes(t.lkey).is_none(), "T stays invalidated");
}

// ============================================================================ ACK ICRC by table (icrc::AckIcrc)

#[test]
fn every_ack_has_a_valid_icrc_across_psn_msn_syndrome_and_ip_ident_wraps() {
    // 70 000 ACKs (the IPv4 identification wraps at 65 536) starting 100 PSNs before the PSN wrap, every MSN from
    // 1 on, with sequence NAKs and RNR NAKs in between: Peer::tx checks the ICRC of every frame against the
    // reference CRC (icrc::compute via parse_frame).
    let mut p = Peer::with(PeerCfg { rq_psn: M - 100, ..PeerCfg::default() });
    let k = p.data.rkey;
    let mut psn = M - 100;
    let mut buf = vec![0u8; BUF_LEN];
    for i in 0..70_000u32 {
        p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, psn).ack_req().reth(DATA_VA, k, 0));
        if i % 1000 == 7 {
            // A gap (sequence NAK) and a SEND without a receive WQE (RNR NAK).
            p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, (psn + 3) & M).ack_req().reth(DATA_VA, k, 0));
            p.rx(Pkt::new(Opcode::RC_SEND_ONLY, (psn + 1) & M).ack_req());
            let v = p.tx();
            let got: Vec<(u32, u8, u32)> = v.iter().map(|o| (o.psn(), o.aeth().syndrome, o.aeth().msn)).collect();
            let next = (psn + 1) & M;
            let want = vec![(psn, ACK, i + 1), (next, seq_nak(), i + 1), (next, 0x20 | p.cfg.min_rnr_timer, i + 1)];
            assert_eq!(got, want, "{}", show(&v));
        } else {
            let n = p.eng.poll_transmit(p.now, &mut buf).expect("an ACK");
            let f = roce_dp::wire::parse_frame(&buf[..n]).unwrap();
            assert!(f.icrc_ok, "bad ICRC on the ACK of PSN {psn:#x}");
            let a = f.repr.ext.aeth.unwrap();
            assert_eq!((f.repr.bth.psn.value(), a.syndrome, a.msn), (psn, ACK, i + 1));
        }
        psn = (psn + 1) & M;
    }
}

#[test]
fn partial_ack_across_the_wrap_resends_only_the_rest_at_the_right_offset() {
    // A 3-packet SEND at 0xfffffe (0xfffffe, 0xffffff, 0); the ACK of 0xffffff acknowledges two packets; on the
    // timeout only the LAST at 0 leaves again, carrying bytes 2048.. of the message.
    let mut p = Peer::with(PeerCfg { sq_psn: M - 1, ..PeerCfg::default() });
    p.fill_data();
    p.post_send(1, 0x100, 2100);
    let first = p.tx();
    assert_eq!(
        ops(&first),
        vec![(Opcode::RC_SEND_FIRST, M - 1), (Opcode::RC_SEND_MIDDLE, M), (Opcode::RC_SEND_LAST, 0)]
    );
    p.rx(ack(M, 0));
    p.no_cqes();
    p.fire();
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_SEND_LAST, 0)], "{}", show(&v));
    assert_eq!(&v[0].payload[..], &p.data()[0x100 + 2048..0x100 + 2100]);
    p.rx(ack(0, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(p.deadline(), None);
}

#[test]
fn read_response_with_an_opcode_that_does_not_fit_its_place_is_a_bad_response() {
    // IBV_WC_BAD_RESP_ERR: an unexpected transport opcode from the responder. A READ_RESPONSE_ONLY (it ends the
    // message) at the first of a 2-packet READ's PSNs, and a READ_RESPONSE_FIRST (it does not) as the only
    // response of a 1-packet READ.
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 2048, RVA, RKEY);
    p.tx_one();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(ACK, 1).fill(0, 1024));
    p.expect_cqes(&[(1, WcStatus::BadRespErr)]);
    assert_eq!(p.state(), QpState::Err);
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 100, RVA, RKEY);
    p.post_send(2, 0, 10);
    assert_eq!(p.tx().len(), 2);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(ACK, 1).fill(0, 100));
    p.expect_cqes(&[(1, WcStatus::BadRespErr), (2, WcStatus::WrFlushErr)]);
}

#[test]
fn rnr_nak_waits_exactly_the_table_time_of_its_code() {
    // ROCE-NOTES §4.4 (IBTA table 45), including code 0 = 655.36 ms and code 25 = 61 440 µs (rxe's table has the
    // typo 61 410).
    let table: [(u8, u64); 8] =
        [(0, 655_360), (1, 10), (2, 20), (5, 60), (12, 640), (19, 7_680), (25, 61_440), (31, 491_520)];
    for (code, us) in table {
        let mut p = Peer::with(PeerCfg { rnr_retry: 7, ..PeerCfg::default() });
        p.post_send(1, 0, 10);
        p.tx_one();
        p.advance(Duration::from_micros(3));
        let t0 = p.now;
        p.rx(rnr_nak(S, code, 0));
        let due = t0 + Duration::from_micros(us);
        p.advance_to(roce_dp::Instant(due.0 - 1));
        p.tx_nothing();
        p.advance_to(due);
        assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S)], "code {code}");
    }
}

#[test]
fn a_responder_with_max_dest_rd_atomic_zero_refuses_reads_and_atomics() {
    // max_dest_rd_atomic = 0: no responder resources, so READ and atomic requests are refused with NAK invalid
    // request (ROCE-NOTES §1.6, "too many RDMA READ/atomic" class); SEND and WRITE still work.
    for pkt in [
        Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA, 0, 8),
        Pkt::new(Opcode::RC_FETCH_ADD, R + 1).ack_req().atomic(DATA_VA, 0, 1, 0),
        Pkt::new(Opcode::RC_COMPARE_SWAP, R + 1).ack_req().atomic(DATA_VA, 0, 1, 0),
    ] {
        let mut p = Peer::with(PeerCfg { max_dest_rd_atomic: 0, ..PeerCfg::default() });
        let k = p.data.rkey;
        p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, k, 8).fill(0, 8));
        p.expect_ack(R, ACK, 1);
        let mut pkt = pkt;
        if let Some(r) = pkt.ext.reth.as_mut() {
            r.rkey = k;
        }
        if let Some(a) = pkt.ext.atomic_eth.as_mut() {
            a.rkey = k;
        }
        let before = p.data().to_vec();
        p.rx(pkt);
        p.expect_nak(R + 1, NakCode::InvalidRequest);
        assert_eq!(p.state(), QpState::Err);
        assert!(p.data() == &before[..]);
    }
}

#[test]
fn rnr_nak_beyond_an_outstanding_read_means_its_responses_were_lost_and_goes_back_at_once() {
    // READ at S..S+1, SEND at S+2. An RNR NAK naming S+2 says the responder executed the READ: its responses were
    // lost. ROCE-NOTES §1.4: a response beyond a pending READ/atomic makes the requester go back (rxe check_psn ->
    // COMPST_ERROR_RETRY) to the READ, at once; the RNR NAK is not the READ's, so with rnr_retry = 0 the READ must
    // not fail with RNR_RETRY_EXC_ERR.
    let mut p = Peer::with(PeerCfg { rnr_retry: 0, ..PeerCfg::default() });
    p.post_read(1, 0x1000, 2048, RVA, RKEY);
    p.post_send(2, 0, 10);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_RDMA_READ_REQUEST, S), (Opcode::RC_SEND_ONLY, S + 2)]);
    p.rx(rnr_nak(S + 2, 1, 1));
    p.no_cqes();
    assert_eq!(p.state(), QpState::Rts);
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_READ_REQUEST, S), (Opcode::RC_SEND_ONLY, S + 2)], "{}", show(&v));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(ACK, 1).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 1).aeth(ACK, 1).fill(1024, 1024));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    p.rx(ack(S + 2, 2));
    p.expect_cqes(&[(2, WcStatus::Success)]);
}

#[test]
fn read_response_beyond_an_outstanding_read_goes_back_at_once() {
    // READ 1 at S..S+1, READ 2 at S+2: READ 2's response arriving first says READ 1's were lost (ROCE-NOTES §1.4,
    // a response beyond a pending READ): both READs are asked for again at once, not after the local ACK timeout.
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 2048, RVA, RKEY);
    p.post_read(2, 0x2000, 16, RVA, RKEY);
    assert_eq!(p.tx().len(), 2);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S + 2).aeth(ACK, 2).fill(0, 16));
    p.no_cqes();
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_READ_REQUEST, S), (Opcode::RC_RDMA_READ_REQUEST, S + 2)], "{}", show(&v));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(ACK, 1).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 1).aeth(ACK, 1).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S + 2).aeth(ACK, 2).fill(0, 16));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(p.state(), QpState::Rts);
}
