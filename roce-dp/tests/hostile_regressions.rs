//! Scripted regression tests for the bugs the hostile suites (hostile_frames.rs, hostile_peer.rs,
//! hostile_config.rs, engine_fuzz.rs) found, each with explicit time.

mod harness;

use harness::*;
use roce_dp::wire::{AethRepr, Opcode};
use roce_dp::{QpAttr, QpState, VerbsError, WcStatus};

fn rts(a: QpAttr) -> QpAttr {
    QpAttr { state: Some(QpState::Rts), ..a }
}

/// The attributes that number and segment a connection's packets, one at a time.
fn fixed_attrs() -> [(&'static str, QpAttr); 4] {
    [
        ("path_mtu", QpAttr { path_mtu: Some(4096), ..QpAttr::default() }),
        ("dest_qpn", QpAttr { dest_qpn: Some(0x99), ..QpAttr::default() }),
        ("rq_psn", QpAttr { rq_psn: Some(5), ..QpAttr::default() }),
        ("sq_psn", QpAttr { sq_psn: Some(5), ..QpAttr::default() }),
    ]
}

/// Found by hostile_peer.rs: `modify_qp(RTS -> RTS, path_mtu)` with a READ in flight, after its first response was
/// placed at the old MTU, made the next response's offset (PSN distance x the new MTU) pass the message's end, and
/// the completer's `length - offset` overflowed (a panic with overflow checks, as in every test build). Now the MTU
/// cannot change once the QP is past RTR, and the READ completes with the data it was sent.
#[test]
fn path_mtu_cannot_change_under_a_read_in_flight() {
    let mut p = Peer::new();
    p.post_read(1, 0, 3000, 0x5000, 0x99);
    let psn = p.tx_one().psn();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, psn).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 1024));
    let e = p.eng.modify_qp(p.qpn, &rts(QpAttr { path_mtu: Some(4096), ..QpAttr::default() })).unwrap_err();
    assert_eq!(e, VerbsError::AttrNotModifiable { attr: "path_mtu", from: QpState::Rts, to: QpState::Rts });
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().path_mtu, 1024);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, psn + 1).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, psn + 2).aeth(AethRepr::ACK_UNLIMITED, 1).fill(2048, 952));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert!((0..3000).all(|i| p.data()[i] == pattern(i)), "the READ's bytes");
    p.assert_guards();
}

/// Found by hostile_peer.rs: `modify_qp(RTS -> RTS, sq_psn)` with a SEND in flight moved the requester's and the
/// completer's PSNs under the WQE: nothing looked outstanding any more, the retransmit timer stopped, and the SEND
/// never completed (a WR without an end, with no timer armed). Now sq_psn is taken only on RTR -> RTS, and the SEND
/// still ends: acknowledged, or retried until RETRY_EXC_ERR when nobody answers.
#[test]
fn sq_psn_cannot_change_under_a_send_in_flight() {
    let mut p = Peer::new();
    p.post_send(1, 0, 100);
    let psn = p.tx_one().psn();
    let e = p.eng.modify_qp(p.qpn, &rts(QpAttr { sq_psn: Some(5), ..QpAttr::default() })).unwrap_err();
    assert_eq!(e, VerbsError::AttrNotModifiable { attr: "sq_psn", from: QpState::Rts, to: QpState::Rts });
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_psn, psn + 1);
    // Nobody answers: the local ACK timer retries retry_cnt times, then the WR ends with RETRY_EXC_ERR.
    for _ in 0..p.cfg.retry_cnt {
        p.fire();
        assert_eq!(p.tx_one().psn(), psn, "a retransmission of the SEND");
    }
    p.fire();
    p.expect_cqes(&[(1, WcStatus::RetryExcErr)]);
    assert_eq!(p.state(), QpState::Err);
}

/// The same four attributes in every transition of a running QP (RTS -> RTS, RTS -> SQD, SQD -> SQD, SQD -> RTS):
/// refused, nothing changed; the transitions that set them (INIT -> RTR, RTR -> RTR, RTR -> RTS for sq_psn) take
/// them as before.
#[test]
fn connection_attributes_are_set_on_the_way_up_only() {
    let mut p = Peer::new();
    let before = p.eng.query_qp(p.qpn).unwrap();
    for (from, to) in [
        (QpState::Rts, QpState::Rts),
        (QpState::Rts, QpState::Sqd),
        (QpState::Sqd, QpState::Sqd),
        (QpState::Sqd, QpState::Rts),
    ] {
        if p.state() != from {
            p.eng.modify_qp(p.qpn, &QpAttr { state: Some(from), ..QpAttr::default() }).unwrap();
        }
        for (attr, a) in fixed_attrs() {
            let e = p.eng.modify_qp(p.qpn, &QpAttr { state: Some(to), ..a }).unwrap_err();
            assert_eq!(e, VerbsError::AttrNotModifiable { attr, from, to });
            assert!(e.to_string().contains(attr), "{e}");
        }
        // The others may change on a running QP.
        p.eng
            .modify_qp(p.qpn, &QpAttr { state: Some(to), timeout: Some(9), retry_cnt: Some(2), ..QpAttr::default() })
            .unwrap();
    }
    let after = p.eng.query_qp(p.qpn).unwrap();
    assert_eq!(
        (after.path_mtu, after.dest_qpn, after.sq_psn, after.rq_psn),
        (1024, REMOTE_QPN, before.sq_psn, before.rq_psn)
    );
    // The way up still takes them: a fresh QP through INIT -> RTR -> RTR -> RTS (the harness's bring-up does the
    // first and the last).
    let mut q = Peer::new();
    q.eng.modify_qp(q.qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    q.eng.modify_qp(q.qpn, &QpAttr { state: Some(QpState::Init), ..QpAttr::default() }).unwrap();
    q.eng.modify_qp(q.qpn, &q.rtr_attr()).unwrap();
    q.eng.modify_qp(q.qpn, &QpAttr { rq_psn: Some(7), path_mtu: Some(2048), ..q.rtr_attr() }).unwrap();
    q.eng.modify_qp(q.qpn, &q.rts_attr()).unwrap();
    let i = q.eng.query_qp(q.qpn).unwrap();
    assert_eq!((i.state, i.path_mtu, i.rq_psn, i.sq_psn), (QpState::Rts, 2048, 7, q.cfg.sq_psn));
    // Not on INIT either (it belongs to INIT -> RTR).
    let e = q.eng.modify_qp(q.qpn, &QpAttr { state: Some(QpState::Err), sq_psn: Some(1), ..QpAttr::default() });
    assert!(matches!(e, Err(VerbsError::AttrNotModifiable { attr: "sq_psn", .. })), "{e:?}");
}

/// A QP that ran out of transport retries, reset and connected again without giving retry_cnt (it keeps its
/// value, as every attribute not given does) must have its retries back: the retry counters restart at RESET.
#[test]
fn a_reset_qp_gets_its_retries_back() {
    let mut p = Peer::new();
    let retries = p.cfg.retry_cnt;
    let run_out = |p: &mut Peer, wr_id: u64| {
        p.post_send(wr_id, 0, 100);
        let psn = p.tx_one().psn();
        for _ in 0..retries {
            p.fire();
            assert_eq!(p.tx_one().psn(), psn, "a retransmission");
        }
        p.fire();
        p.tx_nothing();
        p.expect_cqes(&[(wr_id, WcStatus::RetryExcErr)]);
    };
    run_out(&mut p, 1);
    assert_eq!(p.state(), QpState::Err);
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Init), ..QpAttr::default() }).unwrap();
    p.eng.modify_qp(p.qpn, &p.rtr_attr()).unwrap();
    p.eng
        .modify_qp(p.qpn, &QpAttr { state: Some(QpState::Rts), sq_psn: Some(0x30_0000), ..QpAttr::default() })
        .unwrap();
    run_out(&mut p, 2);
}

/// Found in session 18's fuzzing campaign (reading the transmit path that engine_fuzz.rs's re-registrations under
/// traffic exercise, whose hostile mode cannot see the data; its clean mode now re-registers too and catches this
/// on the old code): a region deregistered while a multi-packet WRITE from it was in flight
/// (one packet sent) made the requester send the rest of the message as zeros (its payload read failed at
/// transmit time: counted in `tx_local_access_errors`, the bytes zero-filled), and once the peer acknowledged the
/// zeros the WR completed with SUCCESS: data the application never had sent reported as delivered. Now the packet
/// whose payload cannot be read is not sent, the WR completes with LOC_PROT_ERR and the QP enters ERR (as a READ
/// response that cannot be placed already did, and as rxe does when an SGE's region is gone).
#[test]
fn region_deregistered_under_a_write_in_flight_is_an_error_not_zeros() {
    let mut buf = vec![0u8; BUF_LEN];
    for (wr_id, write) in [(1, true), (2, false)] {
        let mut p = Peer::new();
        p.fill_data();
        // 3000 bytes at path MTU 1024: three packets, their payload read from the region as each is sent.
        if write {
            p.post_write(wr_id, 0, 3000, 0x5000, 0x99);
        } else {
            p.post_send(wr_id, 0, 3000);
        }
        assert!(p.eng.poll_transmit(p.now, &mut buf).is_some(), "the first packet");
        assert!(p.eng.dereg_mr(p.data.lkey));
        let rest = p.tx();
        assert!(rest.is_empty(), "packets sent from a deregistered region: {}", show(&rest));
        p.expect_cqes(&[(wr_id, WcStatus::LocProtErr)]);
        assert_eq!(p.state(), QpState::Err);
        assert_eq!(p.counters().tx_local_access_errors, 1);
        p.assert_guards();
    }
}
