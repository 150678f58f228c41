//! Scripted responder tests with explicit time: the remote requester is a script of frames, the local QP answers.
//! One test per responder outcome: accept + ACK, each NAK class (ROCE-NOTES §1.6: RNR, PSN sequence error, invalid
//! request, remote access error, remote operational error), duplicates (C9-105 re-ACK, READ re-execution, atomic
//! replay), PSN wrap at 2^24 and ACK coalescing.

mod harness;

use harness::*;
use roce_dp::wire::{AethRepr, NakCode, Opcode};
use roce_dp::{AccessFlags, AckPolicy, Duration, QpState, WcOpcode, WcStatus};

const R: u32 = 0x20_0000; // the responder's first expected PSN (PeerCfg::default().rq_psn)
const ACK: u8 = AethRepr::ACK_UNLIMITED;

fn u64_at(p: &Peer, off: usize) -> u64 {
    u64::from_le_bytes(p.data()[off..off + 8].try_into().unwrap())
}

// ---------------------------------------------------------------------------------------------------- accept

#[test]
fn multi_packet_send_is_placed_acked_once_and_completed() {
    let mut p = Peer::new();
    p.post_recv(7, 0x1000, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.tx_nothing(); // no AckReq yet: no ACK (rxe acks only AckReq'd packets)
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R + 1).fill(1024, 1024));
    p.tx_nothing();
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 2).ack_req().fill(2048, 100));
    p.expect_ack(R + 2, ACK, 1);
    let c = p.cqes();
    assert_eq!(c.len(), 1);
    assert_recv(&c[0], 7, 2148);
    let want: Vec<u8> = (0..2148).map(pattern).collect();
    assert_eq!(&p.data()[0x1000..0x1000 + 2148], &want[..]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R + 3);
    p.assert_guards();
}

#[test]
fn write_with_immediate_consumes_a_receive_and_reports_the_immediate() {
    let mut p = Peer::new();
    p.post_recv(9, 0, 16);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA + 0x2000, p.data.rkey, 1500).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, R + 1).ack_req().imm(0xdead_beef).fill(1024, 476));
    p.expect_ack(R + 1, ACK, 1);
    let c = p.cqes();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!((c[0].wr_id, c[0].status, c[0].opcode), (9, WcStatus::Success, WcOpcode::RecvRdmaWithImm));
    assert_eq!((c[0].byte_len, c[0].imm), (1500, Some(0xdead_beef)));
    let want: Vec<u8> = (0..1500).map(pattern).collect();
    assert_eq!(&p.data()[0x2000..0x2000 + 1500], &want[..]);
}

#[test]
fn zero_length_write_needs_no_valid_rkey() {
    // C9-88 (ROCE-NOTES §1.6): a zero-length RDMA WRITE is not checked against any region.
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(0, 0xdead_0000, 0));
    p.expect_ack(R, ACK, 1);
    assert_eq!(p.state(), QpState::Rts);
}

// ---------------------------------------------------------------------------------------------------- NAK classes

#[test]
fn psn_ahead_gets_one_sequence_nak_per_gap() {
    let mut p = Peer::new();
    for i in 0..4 {
        p.post_recv(i, 0, 64);
    }
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 2).ack_req().fill(0, 8));
    p.expect_ack(R, AethRepr::nak(NakCode::PsnSeqErr, 0).syndrome, 0);
    // The rest of the gap is discarded silently.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 3).ack_req().fill(0, 8));
    p.tx_nothing();
    // The expected PSN arrives: accepted; the next gap earns a new NAK.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.expect_ack(R, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 5).ack_req().fill(0, 8));
    p.expect_ack(R + 1, AethRepr::nak(NakCode::PsnSeqErr, 0).syndrome, 1);
    let c = p.counters();
    assert_eq!((c.out_of_sequence, c.nak_psn_seq_sent), (3, 2));
    assert_eq!(p.cqes().len(), 1, "only the in-order SEND completes");
    assert_eq!(p.state(), QpState::Rts, "a sequence error is not fatal");
}

#[test]
fn no_receive_wqe_gets_rnr_nak_with_the_qp_timer_and_the_retry_is_accepted() {
    let mut p = Peer::with(PeerCfg { min_rnr_timer: 14, ..PeerCfg::default() });
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 32));
    p.expect_ack(R, 0x20 | 14, 0);
    assert_eq!(p.state(), QpState::Rts, "RNR is not fatal");
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R, "the PSN is not consumed");
    p.no_cqes();
    p.post_recv(1, 0, 64);
    p.advance(Duration::from_micros(1280));
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 32));
    p.expect_ack(R, ACK, 1);
    assert_recv(&p.cqes()[0], 1, 32);
    assert_eq!(p.counters().rnr_nak_sent, 1);
}

#[test]
fn write_with_immediate_without_receive_gets_rnr_nak() {
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, R)
        .ack_req()
        .reth(DATA_VA, p.data.rkey, 4)
        .imm(1)
        .fill(0, 4));
    p.expect_ack(R, 0x20 | 4, 0);
}

/// Checks the outcome of a fatal responder error: one NAK of `code` for `psn`, the QP in ERR, posted receives
/// flushed, the guards intact and the data region as before.
fn expect_fatal(p: &mut Peer, psn: u32, code: NakCode, before: &[u8]) {
    p.expect_nak(psn, code);
    assert_eq!(p.state(), QpState::Err);
    p.assert_guards();
    assert!(p.data() == before, "the data region changed");
    p.tx_nothing();
}

/// `before_it` (from the first expected PSN on), then `bad`: a NAK invalid request at `bad`'s PSN (no remote
/// access NAK), the QP in the error state, nothing placed.
fn expect_invalid_request_after(mut p: Peer, before_it: Vec<Pkt>, bad: Pkt, what: &str) {
    let psn = R + before_it.len() as u32;
    for pkt in before_it {
        p.rx(pkt);
    }
    let before = p.data().to_vec();
    p.rx(bad);
    expect_fatal(&mut p, psn, NakCode::InvalidRequest, &before);
    let c = p.counters();
    assert_eq!((c.nak_inv_req_sent, c.nak_rem_access_sent), (1, 0), "{what}");
}

#[test]
fn op_sequence_error_gets_invalid_request_nak() {
    // A MIDDLE with no FIRST before it.
    let mut p = Peer::new();
    p.post_recv(1, 0, 4096);
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R).fill(0, 1024));
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
    p.expect_cqes(&[(1, WcStatus::WrFlushErr)]);
    assert_eq!(p.counters().nak_inv_req_sent, 1);
}

#[test]
fn write_packet_inside_a_send_gets_invalid_request_nak() {
    let mut p = Peer::new();
    p.post_recv(1, 0, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).fill(0, 1024));
    expect_fatal(&mut p, R + 1, NakCode::InvalidRequest, &before);
}

#[test]
fn new_message_inside_a_write_gets_invalid_request_nak() {
    let mut p = Peer::new();
    p.post_recv(1, 0, 4096);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, p.data.rkey, 3000).fill(0, 1024));
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 1).ack_req().fill(0, 10));
    expect_fatal(&mut p, R + 1, NakCode::InvalidRequest, &before);
}

/// The checks of WRITE_ONLY and WRITE_MIDDLE (the responder tests them without walking the opcode's flags): the
/// op sequence both ways, a MIDDLE of other than one MTU; each refused with a NAK and nothing written. And a
/// WRITE made of FIRST, MIDDLEs and LAST, then a WRITE_ONLY, placed whole.
#[test]
fn write_only_and_write_middle_keep_the_op_sequence_and_length_checks() {
    let k = Peer::new().data.rkey;
    let first = || Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, k, 4096).fill(0, 1024);
    let cases: [(&str, Vec<Pkt>, Pkt); 4] = [
        ("MIDDLE with no FIRST", vec![], Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R).fill(0, 1024)),
        (
            "ONLY inside a WRITE",
            vec![first()],
            Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 1).ack_req().reth(DATA_VA, k, 8).fill(0, 8),
        ),
        ("MIDDLE shorter than the MTU", vec![first()], Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).fill(1024, 1020)),
        ("MIDDLE longer than the MTU", vec![first()], Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).fill(1024, 1028)),
    ];
    for (what, before_it, bad) in cases {
        expect_invalid_request_after(Peer::new(), before_it, bad, what);
    }
    let mut p = Peer::new();
    let want: Vec<u8> = (0..4096).map(pattern).collect();
    p.rx(first());
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 2).fill(2048, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST, R + 3).ack_req().fill(3072, 1024));
    p.expect_ack(R + 3, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 4).ack_req().reth(DATA_VA + 8192, k, 64).fill(8192, 64));
    p.expect_ack(R + 4, ACK, 2);
    assert_eq!(&p.data()[..4096], &want[..]);
    assert_eq!(&p.data()[8192..8256], &(8192..8256).map(pattern).collect::<Vec<u8>>()[..]);
    assert_eq!(p.counters().rx_packets, 5);
}

/// The WRITE_ONLY/WRITE_MIDDLE short-cut of the responder's checks (ab796ef) against what the generic checks
/// answer, in the cases where their order shows: a WRITE_ONLY longer than the MTU whose rkey is also bad, or whose
/// QP does not grant REMOTE_WRITE while its zero length needs no rkey (C9-88), is an invalid request (the length
/// and right come before the rkey), not a remote access error; a WRITE_ONLY or WRITE_MIDDLE inside a SEND is an
/// invalid request (op sequence), with nothing placed. A zero-length WRITE_ONLY with a bad
/// rkey on a QP that grants the right is ACKed (C9-88).
#[test]
fn write_only_and_write_middle_short_cut_answers_what_the_generic_checks_do() {
    let send_first = || Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024);
    let cases: [(&str, AccessFlags, Vec<Pkt>, Pkt); 4] = [
        (
            "ONLY longer than the MTU, bad rkey",
            AccessFlags::ALL,
            vec![],
            Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(0, 0xdead_0000, 1025).fill(0, 1025),
        ),
        (
            "zero-length ONLY, bad rkey, no REMOTE_WRITE",
            AccessFlags::REMOTE_READ | AccessFlags::LOCAL_WRITE,
            vec![],
            Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(0, 0xdead_0000, 0),
        ),
        (
            "ONLY inside a SEND",
            AccessFlags::ALL,
            vec![send_first()],
            Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 1).ack_req().reth(DATA_VA, 0xdead_0000, 8).fill(0, 8),
        ),
        (
            "MIDDLE inside a SEND",
            AccessFlags::ALL,
            vec![send_first()],
            Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).fill(0, 1024),
        ),
    ];
    for (what, access, before_it, bad) in cases {
        let mut p = Peer::with(PeerCfg { access, ..PeerCfg::default() });
        p.post_recv(1, 0x8000, 4096);
        expect_invalid_request_after(p, before_it, bad, what);
    }
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(0, 0xdead_0000, 0));
    p.expect_ack(R, ACK, 1);
    p.no_cqes();
}

#[test]
fn first_packet_shorter_than_mtu_gets_invalid_request_nak() {
    // C9-92/C9-94: FIRST and MIDDLE carry exactly one MTU.
    let mut p = Peer::new();
    p.post_recv(1, 0, 4096);
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 512));
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
}

#[test]
fn only_packet_longer_than_mtu_gets_invalid_request_nak() {
    let mut p = Peer::with(PeerCfg { mtu: 256, ..PeerCfg::default() });
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, p.data.rkey, 260).fill(0, 260));
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
}

#[test]
fn last_packet_overrunning_the_write_length_gets_invalid_request_nak() {
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, p.data.rkey, 1100).fill(0, 1024));
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST, R + 1).ack_req().fill(1024, 200));
    expect_fatal(&mut p, R + 1, NakCode::InvalidRequest, &before);
}

#[test]
fn operation_the_qp_does_not_allow_gets_invalid_request_nak() {
    let mut p = Peer::with(PeerCfg { access: AccessFlags::REMOTE_READ, ..PeerCfg::default() });
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, p.data.rkey, 8).fill(0, 8));
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);

    let mut p = Peer::with(PeerCfg { access: AccessFlags::REMOTE_WRITE, ..PeerCfg::default() });
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, p.data.rkey, 1, 0));
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
}

#[test]
fn send_longer_than_the_receive_buffer_gets_invalid_request_nak_and_a_length_error() {
    let mut p = Peer::new();
    p.post_recv(1, 0, 100);
    p.post_recv(2, 0, 100);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 200));
    p.expect_nak(R, NakCode::InvalidRequest);
    p.expect_cqes(&[(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]);
    assert_eq!(p.state(), QpState::Err);
    assert!(p.data()[100..200].iter().all(|&b| b == 0), "bytes beyond the receive buffer were written");
}

#[test]
fn unaligned_atomic_gets_invalid_request_nak() {
    let mut p = Peer::new();
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA + 4, p.data.rkey, 1, 0));
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
}

#[test]
fn reth_beyond_the_region_gets_remote_access_nak_and_writes_nothing() {
    let mut p = Peer::new();
    let before = p.data().to_vec();
    let va = DATA_VA + DATA_LEN as u64 - 8;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(va, p.data.rkey, 16).fill(0, 16));
    expect_fatal(&mut p, R, NakCode::RemoteAccessErr, &before);
    assert_eq!(p.counters().nak_rem_access_sent, 1);
}

#[test]
fn reth_below_the_region_gets_remote_access_nak() {
    let mut p = Peer::new();
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA - 4, p.data.rkey, 8).fill(0, 8));
    expect_fatal(&mut p, R, NakCode::RemoteAccessErr, &before);
}

#[test]
fn reth_length_wrapping_the_address_space_gets_remote_access_nak() {
    let mut p = Peer::new();
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(u64::MAX - 16, p.data.rkey, 1 << 20));
    expect_fatal(&mut p, R, NakCode::RemoteAccessErr, &before);
}

#[test]
fn stale_or_foreign_rkey_gets_remote_access_nak() {
    for bad in [|k: u32| k ^ 1, |k: u32| k + 0x100, |_| 0, |_| u32::MAX] {
        let mut p = Peer::new();
        let before = p.data().to_vec();
        let rkey = bad(p.data.rkey);
        p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, rkey, 8).fill(0, 8));
        expect_fatal(&mut p, R, NakCode::RemoteAccessErr, &before);
    }
}

#[test]
fn region_without_the_right_gets_remote_access_nak() {
    // The guard regions grant nothing: a READ of them is refused even with their correct rkey.
    let mut p = Peer::new();
    let before = p.data().to_vec();
    let g = p.guards[1].rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA + DATA_LEN as u64, g, 8));
    expect_fatal(&mut p, R, NakCode::RemoteAccessErr, &before);
}

#[test]
fn invalidated_rkey_gets_remote_access_nak() {
    let mut p = Peer::new();
    // A second region the remote may write, invalidated by a SEND_WITH_INVALIDATE.
    let t = p.eng.reg_mr(p.pd, 0x90_0000, 4096, AccessFlags::ALL).unwrap();
    p.post_recv(1, 0, 64);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(0x90_0000, t.rkey, 4).payload(&[1, 2, 3, 4]));
    p.expect_ack(R, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R + 1).ack_req().ieth(t.rkey).fill(0, 8));
    p.expect_ack(R + 1, ACK, 2);
    let c = p.cqes();
    assert_eq!((c[0].status, c[0].invalidated_rkey), (WcStatus::Success, Some(t.rkey)), "{c:?}");
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 2).ack_req().reth(0x90_0000, t.rkey, 4).payload(&[9, 9, 9, 9]));
    p.expect_nak(R + 2, NakCode::RemoteAccessErr);
    assert_eq!(p.state(), QpState::Err);
}

#[test]
fn send_with_invalidate_cannot_revoke_a_local_only_region() {
    // The guard region grants no remote right: its key is no rkey, a peer must not be able to revoke it (found by
    // the fuzz test, which then could no longer read its guard regions).
    let mut p = Peer::new();
    p.post_recv(1, 0, 64);
    let g = p.guards[0];
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R).ack_req().ieth(g.rkey).fill(0, 8));
    p.expect_nak(R, NakCode::InvalidRequest);
    p.expect_cqes(&[(1, WcStatus::RemInvReqErr)]);
    assert!(p.eng.mr_bytes(g.lkey).is_some(), "the local-only region was invalidated");
    p.assert_guards();
}

#[test]
fn deregistered_region_gets_remote_access_nak() {
    let mut p = Peer::new();
    let t = p.eng.reg_mr(p.pd, 0x90_0000, 4096, AccessFlags::ALL).unwrap();
    assert!(p.eng.dereg_mr(t.lkey));
    // Its slot is reused with a new generation: the old rkey must not reach the new region.
    let t2 = p.eng.reg_mr(p.pd, 0x90_0000, 4096, AccessFlags::ALL).unwrap();
    assert_ne!(t.rkey, t2.rkey);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(0x90_0000, t.rkey, 4).payload(&[9, 9, 9, 9]));
    p.expect_nak(R, NakCode::RemoteAccessErr);
    assert!(p.eng.mr_bytes(t2.lkey).unwrap().iter().all(|&b| b == 0));
}

#[test]
fn receive_buffer_the_engine_cannot_write_gets_remote_operational_nak() {
    let mut p = Peer::new();
    // The SGE names a guard region, which has no LOCAL_WRITE.
    let g = p.guards[0];
    let sge = roce_dp::Sge { addr: DATA_VA - GUARD_LEN as u64, len: 64, lkey: g.lkey };
    p.eng.post_recv(p.qpn, 5, &[sge]).unwrap();
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 32));
    expect_fatal(&mut p, R, NakCode::RemoteOpErr, &before);
    p.expect_cqes(&[(5, WcStatus::LocProtErr)]);
    assert_eq!(p.counters().nak_rem_op_sent, 1);
}

// ---------------------------------------------------------------------------------------------------- duplicates

/// Exactly the READ response packets `first..first + n` (FIRST, MIDDLE..., LAST, or ONLY).
fn expect_read_stream(p: &mut Peer, first: u32, n: u32) -> Vec<Out> {
    let v = p.tx();
    let got: Vec<(Opcode, u32)> = v.iter().map(|o| (o.op(), o.psn())).collect();
    let want: Vec<(Opcode, u32)> = (0..n)
        .map(|i| {
            let op = match (i == 0, i + 1 == n) {
                (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            };
            (op, first + i)
        })
        .collect();
    assert_eq!(got, want, "{}", show(&v));
    v
}

#[test]
fn duplicate_send_is_acked_again_and_not_placed_twice() {
    // C9-105: ACK again with the PSN of the last accepted request.
    let mut p = Peer::new();
    p.post_recv(1, 0, 64);
    p.post_recv(2, 64, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 16));
    p.expect_ack(R, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 1).ack_req().fill(16, 16));
    p.expect_ack(R + 1, ACK, 2);
    let snapshot = p.data().to_vec();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().payload(&[0xee; 16]));
    p.expect_ack(R + 1, ACK, 2);
    assert_eq!(p.cqes().len(), 2, "a duplicate consumes no receive WQE");
    assert!(p.data() == &snapshot[..], "a duplicate was placed");
    assert_eq!(p.counters().duplicate_requests, 1);
}

#[test]
fn duplicate_read_is_executed_again_from_memory() {
    let mut p = Peer::new();
    p.fill_data();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA + 100, k, 2500));
    let v = expect_read_stream(&mut p, R, 3);
    // AETH on FIRST and LAST only (ROCE-NOTES §4.2), MSN counted at execution (C9-148).
    assert_eq!(v[0].aeth(), AethRepr::ack(1));
    assert!(v[1].repr.ext.aeth.is_none());
    assert_eq!(v[2].aeth(), AethRepr::ack(1));
    let all: Vec<u8> = v.iter().flat_map(|o| o.payload.clone()).collect();
    assert_eq!(&all[..], &p.data()[100..2600]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R + 3, "a READ consumes one PSN per response packet");

    // Memory changes; the requester lost the responses from R+1 on and asks again from there.
    for b in &mut p.data_mut()[1000..3000] {
        *b = 0x5a;
    }
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA + 100 + 1024, k, 2500 - 1024));
    let v = expect_read_stream(&mut p, R + 1, 2);
    let all: Vec<u8> = v.iter().flat_map(|o| o.payload.clone()).collect();
    assert_eq!(&all[..], &p.data()[1124..2600], "the duplicate READ must read memory again");
    assert_eq!(v[0].aeth().msn, 1, "a replay reports the original MSN");
    // The stream continues at the expected PSN as if nothing happened.
    p.post_recv(1, 0x8000, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 3).ack_req().fill(0, 4));
    p.expect_ack(R + 3, ACK, 2);
}

#[test]
fn duplicate_read_not_matching_the_original_is_dropped() {
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 2048));
    assert_eq!(p.tx().len(), 2);
    // Same PSN, another address / length / rkey: ROCE-NOTES §1.6 "must be same rkey and a sub-range".
    for pkt in [
        Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA + 8, k, 2048),
        Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 4096),
        Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, p.guards[0].rkey, 2048),
    ] {
        p.rx(pkt);
        p.tx_nothing();
    }
    assert_eq!(p.counters().dropped_requests, 3);
    assert_eq!(p.state(), QpState::Rts);
}

#[test]
fn duplicate_atomic_replays_the_saved_result_without_executing_again() {
    let mut p = Peer::new();
    p.data_mut()[..8].copy_from_slice(&5u64.to_le_bytes());
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 10, 0));
    let o = p.tx_one();
    assert_eq!(
        (o.op(), o.psn(), o.repr.ext.atomic_ack, o.aeth()),
        (Opcode::RC_ATOMIC_ACKNOWLEDGE, R, Some(5), AethRepr::ack(1))
    );
    assert_eq!(u64_at(&p, 0), 15);
    p.rx(Pkt::new(Opcode::RC_COMPARE_SWAP, R + 1).ack_req().atomic(DATA_VA, k, 99, 15));
    let o = p.tx_one();
    assert_eq!((o.psn(), o.repr.ext.atomic_ack, o.aeth().msn), (R + 1, Some(15), 2));
    assert_eq!(u64_at(&p, 0), 99);
    // Both arrive again (their ACKs were lost): the saved originals come back, memory is untouched.
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 10, 0));
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.repr.ext.atomic_ack, o.aeth().msn), (Opcode::RC_ATOMIC_ACKNOWLEDGE, R, Some(5), 1));
    p.rx(Pkt::new(Opcode::RC_COMPARE_SWAP, R + 1).ack_req().atomic(DATA_VA, k, 99, 15));
    let o = p.tx_one();
    assert_eq!((o.psn(), o.repr.ext.atomic_ack, o.aeth().msn), (R + 1, Some(15), 2));
    assert_eq!(u64_at(&p, 0), 99, "an atomic was executed twice");
    // A duplicate whose resource is gone (older than max_dest_rd_atomic) is dropped.
    let mut p = Peer::with(PeerCfg { max_dest_rd_atomic: 1, ..PeerCfg::default() });
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 1, 0));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 1).ack_req().atomic(DATA_VA, k, 1, 0));
    assert_eq!(p.tx().len(), 2);
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 1, 0));
    p.tx_nothing();
    assert_eq!(u64_at(&p, 0), 2);
}

// ---------------------------------------------------------------------------------------------------- PSN space

#[test]
fn receive_across_the_psn_wrap() {
    let mut p = Peer::with(PeerCfg { rq_psn: 0xff_fffe, ..PeerCfg::default() });
    p.post_recv(1, 0, 4096);
    p.post_recv(2, 0, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, 0xff_fffe).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, 0xff_ffff).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, 0).ack_req().fill(2048, 10));
    p.expect_ack(0, ACK, 1);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, 1);
    // 0xffffff is now behind (a duplicate), 2 is ahead (a gap at 1).
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, 0xff_ffff).ack_req().fill(0, 10));
    p.expect_ack(0, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, 2).ack_req().fill(0, 10));
    p.expect_ack(1, AethRepr::nak(NakCode::PsnSeqErr, 0).syndrome, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, 1).ack_req().fill(0, 10));
    p.expect_ack(1, ACK, 2);
    assert_eq!(p.cqes().len(), 2);
}

#[test]
fn psn_far_outside_the_window_is_a_duplicate_or_a_gap_never_accepted() {
    // 24-bit serial arithmetic (ROCE-NOTES §4.5): up to 2^23 - 1 ahead is a gap (one NAK), 2^23 and more ahead is
    // behind, i.e. a duplicate (re-ACKed, not executed).
    let mut p = Peer::new();
    p.post_recv(1, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 4));
    p.expect_ack(R, ACK, 1);
    let snapshot = p.data().to_vec();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, (R + 1 + (1 << 23)) & 0xff_ffff)
        .ack_req()
        .reth(DATA_VA, k, 4)
        .payload(&[7; 4]));
    p.expect_ack(R, ACK, 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, (R + 1 + (1 << 23) - 1) & 0xff_ffff)
        .ack_req()
        .reth(DATA_VA, k, 4)
        .payload(&[7; 4]));
    p.expect_ack(R + 1, AethRepr::nak(NakCode::PsnSeqErr, 0).syndrome, 1);
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R.wrapping_sub(1 << 22) & 0xff_ffff).ack_req().atomic(DATA_VA, k, 1, 0));
    p.tx_nothing(); // an atomic duplicate with no saved result: dropped
    assert!(p.data() == &snapshot[..]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R + 1);
}

// ---------------------------------------------------------------------------------------------------- ACK policy

#[test]
fn acks_are_coalesced_by_count_and_by_delay() {
    let ack = AckPolicy { max_pkts: 3, max_delay: Duration::from_micros(50) };
    let mut p = Peer::with(PeerCfg { ack, ..PeerCfg::default() });
    for i in 0..8 {
        p.post_recv(i, 0, 64);
    }
    for i in 0..2 {
        p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + i).ack_req().fill(0, 8));
        p.tx_nothing();
    }
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 2).ack_req().fill(0, 8));
    p.expect_ack(R + 2, ACK, 3);
    // One more: held until 50 µs after it arrived.
    p.advance(Duration::from_micros(10));
    let t0 = p.now;
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 3).ack_req().fill(0, 8));
    assert_eq!(p.deadline(), Some(t0 + Duration::from_micros(50)));
    p.advance(Duration::from_nanos(49_999));
    p.tx_nothing();
    p.advance(Duration::from_nanos(1));
    p.expect_ack(R + 3, ACK, 4);
    assert_eq!(p.deadline(), None);
    // A NAK never overtakes a held ACK: the ACK leaves first.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 4).ack_req().fill(0, 8));
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 9).ack_req().fill(0, 8));
    let v = p.tx();
    let got: Vec<(u32, u8)> = v.iter().map(|o| (o.psn(), o.aeth().syndrome)).collect();
    assert_eq!(got, vec![(R + 4, ACK), (R + 5, 0x60)], "{}", show(&v));
}

#[test]
fn default_policy_acks_every_ack_requested_packet_at_once() {
    let mut p = Peer::new();
    let k = p.data.rkey;
    for i in 0..3 {
        p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + i).ack_req().reth(DATA_VA, k, 8).fill(0, 8));
        p.expect_ack(R + i, ACK, i + 1);
    }
    assert_eq!(p.deadline(), None, "the responder arms no timer");
}

#[test]
fn duplicate_read_while_its_responses_are_still_queued_restarts_the_stream() {
    let mut p = Peer::new();
    p.fill_data();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 3072));
    let mut buf = vec![0u8; BUF_LEN];
    let n = p.eng.poll_transmit(p.now, &mut buf).expect("first response");
    assert_eq!(roce_dp::wire::parse_frame(&buf[..n]).unwrap().repr.bth.psn.value(), R);
    // The whole READ again before the rest left: one stream, restarted at R, not two.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 3072));
    expect_read_stream(&mut p, R, 3);
}

#[test]
fn duplicate_of_an_older_read_is_served_from_the_resource_ring() {
    let mut p = Peer::new();
    p.fill_data();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 100));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA + 200, k, 100));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 2).ack_req().atomic(DATA_VA + 1024, k, 1, 0));
    assert_eq!(p.tx().len(), 3);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 100));
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.aeth().msn), (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R, 1));
    assert_eq!(&o.payload[..], &p.data()[..100]);
}

#[test]
fn zero_length_read_needs_no_valid_rkey() {
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(0, 0xdead, 0));
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.payload.len()), (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R, 0));
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R + 1);
}

#[test]
fn send_with_immediate_reports_the_immediate() {
    let mut p = Peer::new();
    p.post_recv(1, 0, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_LAST_WITH_IMMEDIATE, R + 1).ack_req().imm(0x5566_7788).fill(1024, 3));
    p.expect_ack(R + 1, ACK, 1);
    let c = p.cqes();
    assert_eq!((c[0].byte_len, c[0].imm, c[0].opcode), (1027, Some(0x5566_7788), WcOpcode::Recv));
}

#[test]
fn ack_requested_inside_a_message_is_acked_without_counting_a_message() {
    // rxe's requester sets AckReq every 64 packets inside long messages (ROCE-NOTES §1.5): the ACK carries that
    // PSN and the MSN of completed messages only.
    let mut p = Peer::new();
    p.post_recv(1, 0, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).ack_req().fill(0, 1024));
    p.expect_ack(R, ACK, 0);
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 1).ack_req().fill(1024, 1));
    p.expect_ack(R + 1, ACK, 1);
}

#[test]
fn duplicate_read_keeps_later_queued_responses_behind_it_and_their_duplicates_replay_in_psn_order() {
    // A READ (R..R+2) and a FETCH_ADD (R+3) are queued; the requester goes back to R+1 (a duplicate READ there):
    // responses keep PSN order, the READ restarted from R+1 and the queued atomic ACK after it (its request was
    // executed: a request the network duplicated would otherwise leave it to the requester's timeout); the
    // atomic's own duplicate then replays it.
    let mut p = Peer::new();
    p.fill_data();
    p.data_mut()[0x800..0x808].copy_from_slice(&40u64.to_le_bytes());
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 3000));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 3).ack_req().atomic(DATA_VA + 0x800, k, 2, 0));
    let mut buf = vec![0u8; BUF_LEN];
    assert!(p.eng.poll_transmit(p.now, &mut buf).is_some(), "READ response R");
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA + 1024, k, 3000 - 1024));
    let v = p.tx();
    let got: Vec<(Opcode, u32)> = v.iter().map(|o| (o.op(), o.psn())).collect();
    let want = vec![
        (Opcode::RC_RDMA_READ_RESPONSE_FIRST, R + 1),
        (Opcode::RC_RDMA_READ_RESPONSE_LAST, R + 2),
        (Opcode::RC_ATOMIC_ACKNOWLEDGE, R + 3),
    ];
    assert_eq!(got, want, "{}", show(&v));
    assert_eq!(&v[1].payload[..], &p.data()[2048..3000]);
    assert_eq!((v[2].repr.ext.atomic_ack, v[2].aeth().msn), (Some(40), 2));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 3).ack_req().atomic(DATA_VA + 0x800, k, 2, 0));
    let o = p.tx_one();
    assert_eq!(
        (o.op(), o.psn(), o.repr.ext.atomic_ack, o.aeth().msn),
        (Opcode::RC_ATOMIC_ACKNOWLEDGE, R + 3, Some(40), 2)
    );
    assert_eq!(u64_at(&p, 0x800), 42, "the atomic executed exactly once");
}

#[test]
fn dma_length_over_2_pow_31_gets_invalid_request_nak() {
    // ROCE-NOTES §1.6: RETH length <= 2^31 (a length error, before any rkey check).
    for op in [Opcode::RC_RDMA_READ_REQUEST, Opcode::RC_RDMA_WRITE_FIRST] {
        let mut p = Peer::new();
        let before = p.data().to_vec();
        let mut pkt = Pkt::new(op, R).ack_req().reth(DATA_VA, p.data.rkey, (1 << 31) + 1);
        if op == Opcode::RC_RDMA_WRITE_FIRST {
            pkt = pkt.fill(0, 1024);
        }
        p.rx(pkt);
        expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
    }
}

#[test]
fn flush_and_atomic_write_are_unsupported_and_get_invalid_request_nak() {
    // Not implemented by this engine: the unsupported-opcode class of ROCE-NOTES §1.6.
    let mut p = Peer::new();
    let before = p.data().to_vec();
    let mut f = Pkt::new(Opcode::RC_FLUSH, R).ack_req().reth(DATA_VA, p.data.rkey, 64);
    f.ext.feth = Some(1);
    p.rx(f);
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_ATOMIC_WRITE, R).ack_req().reth(DATA_VA, p.data.rkey, 8).payload(&[1; 8]));
    expect_fatal(&mut p, R, NakCode::InvalidRequest, &before);
}

#[test]
fn a_send_is_scattered_across_the_receive_sges_in_order() {
    let mut p = Peer::new();
    let sgl = [p.sge(0x3000, 100), p.sge(0x5000, 1), p.sge(0x6000, 2000)];
    p.eng.post_recv(p.qpn, 1, &sgl).unwrap();
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 1).ack_req().fill(1024, 476));
    p.expect_ack(R + 1, ACK, 1);
    assert_recv(&p.cqes()[0], 1, 1500);
    let want: Vec<u8> = (0..1500).map(pattern).collect();
    let d = p.data();
    assert_eq!(&d[0x3000..0x3000 + 100], &want[..100]);
    assert_eq!(d[0x5000], want[100]);
    assert_eq!(&d[0x6000..0x6000 + 1399], &want[101..]);
    assert!(d[0x3064..0x5000].iter().all(|&b| b == 0) && d[0x6000 + 1399..].iter().all(|&b| b == 0));
}
