//! Session-10 audit of the completer: a READ response or ATOMIC_ACKNOWLEDGE whose PSN is one of the outstanding
//! WQE's own PSNs but which is not the response that request gets (ROCE-NOTES §1.2: a READ is answered by
//! READ_RESPONSE_*, an atomic by ATOMIC_ACKNOWLEDGE, a SEND/WRITE by ACKNOWLEDGE) is an unexpected transport opcode
//! from the responder: verbs' IBV_WC_BAD_RESP_ERR for that WQE, the QP in ERR and everything behind it flushed, as
//! rxe's completer does (`check_ack`: an atomic ACK or READ response for a WQE of another kind is an error). Nothing
//! of the wrong response may be placed in the requester's memory. The old completer counted these and went on
//! waiting, so the WQE finished only by a retry timeout (or never, with a responder that keeps answering wrongly).

mod harness;

use harness::*;
use roce_dp::wire::{AethRepr, Opcode};
use roce_dp::{QpState, WcStatus};

/// The requester's first PSN (PeerCfg::default().sq_psn).
const S: u32 = 0x10_0000;
const ACK: u8 = AethRepr::ACK_UNLIMITED;
const RVA: u64 = 0x7f00_0000_1000;
const RKEY: u32 = 0x1234;

fn atomic_ack(psn: u32, msn: u32, orig: u64) -> Pkt {
    Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, psn).aeth(ACK, msn).atomic_ack(orig)
}

#[test]
fn an_atomic_ack_at_an_outstanding_reads_psn_is_a_bad_response() {
    // A 2-packet READ (PSNs S and S+1) then a SEND; an ATOMIC_ACKNOWLEDGE at each of the READ's PSNs.
    for psn in [S, S + 1] {
        let mut p = Peer::new();
        p.post_read(1, 0x1000, 2048, RVA, RKEY);
        p.post_send(2, 0, 10);
        assert_eq!(p.tx().len(), 2);
        p.rx(atomic_ack(psn, 1, u64::MAX));
        p.expect_cqes(&[(1, WcStatus::BadRespErr), (2, WcStatus::WrFlushErr)]);
        assert_eq!(p.state(), QpState::Err, "PSN {psn:#x}");
        assert!(p.data()[0x1000..0x1000 + 2048].iter().all(|&b| b == 0), "the atomic's value was placed");
        p.assert_guards();
    }
}

#[test]
fn a_read_response_at_an_outstanding_atomics_psn_is_a_bad_response() {
    for op in [Opcode::RC_RDMA_READ_RESPONSE_ONLY, Opcode::RC_RDMA_READ_RESPONSE_FIRST] {
        let mut p = Peer::new();
        p.post_fetch_add(1, 0x100, RVA, RKEY, 1);
        p.tx_one();
        p.rx(Pkt::new(op, S).aeth(ACK, 1).fill(0, 8));
        p.expect_cqes(&[(1, WcStatus::BadRespErr)]);
        assert_eq!(p.state(), QpState::Err, "{op:?}");
        assert_eq!(&p.data()[0x100..0x108], &[0; 8], "{op:?}: the READ data was placed as the atomic's result");
    }
}

#[test]
fn a_read_response_or_atomic_ack_at_a_send_or_write_psn_is_a_bad_response() {
    // A SEND/WRITE is answered by ACKNOWLEDGE only.
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    p.post_write(2, 0, 10, RVA, RKEY);
    assert_eq!(p.tx().len(), 2);
    // The READ response at S+1 acknowledges the SEND at S (every response implicitly acknowledges earlier
    // SEND/WRITE packets, ROCE-NOTES §1.4), then fails the WRITE it lands on.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S + 1).aeth(ACK, 2).fill(0, 10));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::BadRespErr)]);
    assert_eq!(p.state(), QpState::Err);

    let mut p = Peer::new();
    p.post_write(1, 0, 3000, RVA, RKEY);
    assert_eq!(p.tx().len(), 3);
    p.rx(atomic_ack(S + 1, 0, 9));
    p.expect_cqes(&[(1, WcStatus::BadRespErr)]);
    assert_eq!(p.state(), QpState::Err);
}

#[test]
fn a_response_beyond_the_outstanding_read_still_goes_back_for_it() {
    // Not an unexpected opcode: an ATOMIC_ACKNOWLEDGE for the atomic after a READ means the READ's responses were
    // lost (ROCE-NOTES §1.4, rxe check_psn): the requester resends from the READ and the QP stays in RTS.
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 100, RVA, RKEY);
    p.post_fetch_add(2, 0x100, RVA, RKEY, 1);
    assert_eq!(p.tx().len(), 2);
    p.rx(atomic_ack(S + 1, 2, 3));
    p.no_cqes();
    assert_eq!(p.state(), QpState::Rts);
    let v = p.tx();
    assert_eq!(v.first().map(|o| (o.op(), o.psn())), Some((Opcode::RC_RDMA_READ_REQUEST, S)), "{}", show(&v));
}
