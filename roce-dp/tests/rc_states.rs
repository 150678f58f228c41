//! QP state transitions and flushes, scripted with explicit time.

mod harness;

use harness::*;
use roce_dp::wire::{AethRepr, Opcode};
use roce_dp::{AccessFlags, Duration, QpAttr, QpCaps, QpState, SendWr, VerbsError, WcStatus, WrOpcode};

const S: u32 = 0x10_0000;
const R: u32 = 0x20_0000;

fn to(s: QpState) -> QpAttr {
    QpAttr { state: Some(s), ..QpAttr::default() }
}

/// A peer whose QP is still in RESET (created, not brought up).
fn fresh() -> Peer {
    let mut p = Peer::new();
    p.eng.modify_qp(p.qpn, &to(QpState::Reset)).unwrap();
    assert_eq!(p.state(), QpState::Reset);
    p
}

#[test]
fn illegal_transitions_are_refused_and_change_nothing() {
    let mut p = fresh();
    for bad in [QpState::Rtr, QpState::Rts, QpState::Sqd] {
        let e = p.eng.modify_qp(p.qpn, &to(bad)).unwrap_err();
        assert_eq!(e, VerbsError::BadTransition { from: QpState::Reset, to: bad });
    }
    p.eng.modify_qp(p.qpn, &to(QpState::Init)).unwrap();
    assert!(matches!(p.eng.modify_qp(p.qpn, &to(QpState::Rts)), Err(VerbsError::BadTransition { .. })));
    // INIT -> RTR needs the path attributes.
    assert_eq!(p.eng.modify_qp(p.qpn, &to(QpState::Rtr)), Err(VerbsError::MissingAttr("path_mtu")));
    let mut a = p.rtr_attr();
    a.path_mtu = Some(1000);
    assert_eq!(p.eng.modify_qp(p.qpn, &a), Err(VerbsError::BadAttr("path_mtu", 1000)));
    a = p.rtr_attr();
    a.rq_psn = Some(1 << 24);
    assert!(matches!(p.eng.modify_qp(p.qpn, &a), Err(VerbsError::BadAttr("rq_psn", _))));
    assert_eq!(p.state(), QpState::Init, "a failed modify changes nothing");
    p.eng.modify_qp(p.qpn, &p.rtr_attr()).unwrap();
    // RTR -> RTS needs the send PSN; out-of-range values are refused.
    assert_eq!(p.eng.modify_qp(p.qpn, &to(QpState::Rts)), Err(VerbsError::MissingAttr("sq_psn")));
    let mut a = p.rts_attr();
    a.timeout = Some(32);
    assert!(matches!(p.eng.modify_qp(p.qpn, &a), Err(VerbsError::BadAttr("timeout", 32))));
    a = p.rts_attr();
    a.retry_cnt = Some(8);
    assert!(matches!(p.eng.modify_qp(p.qpn, &a), Err(VerbsError::BadAttr("retry_cnt", 8))));
    assert_eq!(p.state(), QpState::Rtr);
    p.eng.modify_qp(p.qpn, &p.rts_attr()).unwrap();
    assert_eq!(p.state(), QpState::Rts);
    assert!(matches!(p.eng.modify_qp(p.qpn, &to(QpState::Init)), Err(VerbsError::BadTransition { .. })));
    assert!(matches!(p.eng.modify_qp(p.qpn + 100, &to(QpState::Err)), Err(VerbsError::NoSuchQp(_))));
}

#[test]
fn sends_are_refused_before_rts_and_receives_before_init() {
    let mut p = fresh();
    let s = p.sge(0, 8);
    assert_eq!(p.eng.post_recv(p.qpn, 1, &[s]), Err(VerbsError::BadState(QpState::Reset)));
    let wr = SendWr::new(1, WrOpcode::Send);
    assert_eq!(p.eng.post_send(p.qpn, &wr, &[s]), Err(VerbsError::BadState(QpState::Reset)));
    p.eng.modify_qp(p.qpn, &QpAttr { access: Some(AccessFlags::ALL), ..to(QpState::Init) }).unwrap();
    assert_eq!(p.eng.post_send(p.qpn, &wr, &[s]), Err(VerbsError::BadState(QpState::Init)));
    p.eng.post_recv(p.qpn, 1, &[s]).unwrap();
    p.eng.modify_qp(p.qpn, &p.rtr_attr()).unwrap();
    assert_eq!(p.eng.post_send(p.qpn, &wr, &[s]), Err(VerbsError::BadState(QpState::Rtr)));
}

#[test]
fn frames_to_a_qp_in_reset_or_init_are_dropped_and_counted() {
    let mut p = fresh();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.eng.modify_qp(p.qpn, &to(QpState::Init)).unwrap();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.tx_nothing();
    assert_eq!(p.eng.stats().rx_drop_bad_state, 2);
}

#[test]
fn rtr_runs_the_responder_only() {
    let mut p = fresh();
    p.eng.modify_qp(p.qpn, &to(QpState::Init)).unwrap();
    p.post_recv(1, 0, 64);
    p.eng.modify_qp(p.qpn, &p.rtr_attr()).unwrap();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.expect_ack(R, AethRepr::ACK_UNLIMITED, 1);
    assert_recv(&p.cqes()[0], 1, 8);
    // A response for the requester is not expected in RTR.
    p.rx(ack(S, 0));
    assert_eq!(p.counters().bad_responses, 1);
}

#[test]
fn moving_to_err_flushes_every_outstanding_wr_in_order() {
    let mut p = Peer::new();
    p.post_send(1, 0, 3000);
    p.post_send(2, 0, 10);
    assert_eq!(p.tx().len(), 4);
    p.post_send(3, 0, 10); // posted, never sent
    p.post_recv(10, 0, 64);
    p.post_recv(11, 0, 64);
    p.eng.modify_qp(p.qpn, &to(QpState::Err)).unwrap();
    let c = p.cqes();
    let got: Vec<(u64, WcStatus)> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.deadline(), None, "no timer survives the error state");
    p.tx_nothing();
    p.advance(Duration::from_millis(1000));
    p.tx_nothing();
    // New WRs complete at once with a flush error.
    p.post_send(4, 0, 10);
    p.post_recv(12, 0, 10);
    p.expect_cqes(&[(4, WcStatus::WrFlushErr), (12, WcStatus::WrFlushErr)]);
    p.tx_nothing();
    // Frames in ERR get no answer and change nothing.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.rx(ack(S + 4, 3));
    p.tx_nothing();
    p.no_cqes();
}

#[test]
fn reset_empties_the_queues_without_completions_and_the_qp_can_be_reused() {
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    p.post_recv(2, 0, 64);
    p.tx();
    p.eng.modify_qp(p.qpn, &to(QpState::Reset)).unwrap();
    p.no_cqes();
    assert_eq!(p.deadline(), None);
    let q = p.eng.query_qp(p.qpn).unwrap();
    assert_eq!((q.sq_outstanding, q.rq_posted), (0, 0));
    // Up again with new PSNs: a clean start.
    p.cfg.sq_psn = 0x42;
    p.cfg.rq_psn = 0x99;
    p.bring_up();
    p.post_send(3, 0, 10);
    assert_eq!(p.tx_one().psn(), 0x42);
    p.rx(ack(0x42, 1));
    p.expect_cqes(&[(3, WcStatus::Success)]);
    p.post_recv(4, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, 0x99).ack_req().fill(0, 8));
    p.expect_ack(0x99, AethRepr::ACK_UNLIMITED, 1);
}

#[test]
fn sqd_starts_no_new_wr_but_finishes_the_started_ones() {
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    p.tx();
    p.eng.modify_qp(p.qpn, &to(QpState::Sqd)).unwrap();
    p.post_send(2, 0, 10);
    p.tx_nothing();
    p.rx(ack(S, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    p.tx_nothing();
    p.eng.modify_qp(p.qpn, &to(QpState::Rts)).unwrap();
    assert_eq!(p.tx_one().psn(), S + 1);
}

#[test]
fn fatal_error_from_the_wire_flushes_the_other_queue_too() {
    // A responder error (here a bad rkey) also flushes the send queue.
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    p.tx();
    p.post_recv(2, 0, 10);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, 0xbad, 4).fill(0, 4));
    assert_eq!(p.tx_one().aeth().syndrome, 0x62);
    p.expect_cqes(&[(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]);
}

#[test]
fn send_queue_full_and_bad_work_requests_are_refused_at_post() {
    let caps = QpCaps { max_send_wr: 2, max_send_sge: 1, max_inline: 16, ..QpCaps::default() };
    let mut p = Peer::with(PeerCfg { caps, ..PeerCfg::default() });
    let s = p.sge(0, 8);
    let wr = SendWr::new(1, WrOpcode::Send);
    assert_eq!(p.eng.post_send(p.qpn, &wr, &[s, s]), Err(VerbsError::TooManySge(2)));
    let mut inl = wr;
    inl.inline = true;
    assert_eq!(p.eng.post_send(p.qpn, &inl, &[p.sge(0, 17)]), Err(VerbsError::BadInline(17)));
    let a = SendWr::new(1, WrOpcode::AtomicFetchAdd);
    assert_eq!(p.eng.post_send(p.qpn, &a, &[p.sge(0, 4)]), Err(VerbsError::BadLength(4)));
    p.eng.post_send(p.qpn, &wr, &[s]).unwrap();
    p.eng.post_send(p.qpn, &wr, &[s]).unwrap();
    assert_eq!(p.eng.post_send(p.qpn, &wr, &[s]), Err(VerbsError::QueueFull));
}
#[test]
fn a_bad_lkey_completes_with_a_local_protection_error() {
    let mut p = Peer::new();
    p.post_send(1, 0, 10);
    let bad = roce_dp::Sge { addr: DATA_VA, len: 10, lkey: p.data.lkey ^ 0x1 };
    p.post(SendWr::new(2, WrOpcode::Send), &[bad]);
    // A READ into a region without LOCAL_WRITE (a guard).
    let g = roce_dp::Sge { addr: DATA_VA - GUARD_LEN as u64, len: 8, lkey: p.guards[0].lkey };
    p.post(SendWr::new(3, WrOpcode::RdmaRead).remote(0x1000, 1), &[g]);
    let v = p.tx();
    assert_eq!(v.len(), 1, "only the valid WR leaves: {}", show(&v));
    p.expect_cqes(&[(1, WcStatus::WrFlushErr), (2, WcStatus::LocProtErr), (3, WcStatus::WrFlushErr)]);
    assert_eq!(p.state(), QpState::Err);
    p.assert_guards();
}

#[test]
fn a_full_completion_queue_moves_the_qp_to_err() {
    // ROCE-NOTES §1.6: CQ overflow -> QP error.
    let mut p = Peer::with(PeerCfg { cq_depth: 1, ..PeerCfg::default() });
    p.post_recv(1, 0, 64);
    p.post_recv(2, 64, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.expect_ack(R, AethRepr::ACK_UNLIMITED, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R + 1).ack_req().fill(0, 8));
    // The message whose completion was lost is not acknowledged (rxe: RESPST_ERR_CQ_OVERFLOW ends before the
    // ACK step), so the sender learns of the failure by its retries instead of a false success.
    p.tx_nothing();
    assert_eq!(p.state(), QpState::Err);
    assert_eq!(p.counters().cq_overflows, 1);
    let c = p.cqes();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_recv(&c[0], 1, 8);
}

#[test]
fn a_buffer_too_small_for_the_path_mtu_loses_nothing() {
    let mut p = Peer::new();
    p.post_send(1, 0, 100);
    let mut small = vec![0u8; 1024];
    assert_eq!(p.eng.poll_transmit(p.now, &mut small), None);
    assert_eq!(p.eng.stats().tx_buffer_too_small, 1);
    assert_eq!(p.tx_one().psn(), 0x10_0000, "the frame leaves with the next big enough buffer");
}

#[test]
fn an_ipv6_peer_is_answered_over_ipv6_and_other_sources_are_dropped() {
    use roce_dp::wire::{emit_frame, parse_frame, IpAddrs, RoceRepr};
    use roce_dp::{Engine, EngineConfig, Instant, LocalIp, PeerAddr, RxMeta};
    let local: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let remote: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let mut eng =
        Engine::new(EngineConfig { local_ip: LocalIp { v4: None, v6: Some(local) }, ..EngineConfig::default() });
    let pd = eng.alloc_pd();
    let mr = eng.reg_mr(pd, 0, 4096, AccessFlags::ALL).unwrap();
    let cq = eng.create_cq(16).unwrap();
    let q = eng.create_qp(pd, cq, cq, QpCaps::default()).unwrap();
    eng.modify_qp(q, &QpAttr { access: Some(AccessFlags::ALL), ..to(QpState::Init) }).unwrap();
    // An IPv4 peer on a port without an IPv4 address is refused.
    let v4 = PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: [10, 0, 0, 2] }, mac: REMOTE_MAC };
    let mut rtr = QpAttr {
        path_mtu: Some(1024),
        dest_qpn: Some(REMOTE_QPN),
        rq_psn: Some(R),
        peer: Some(v4),
        ..to(QpState::Rtr)
    };
    assert!(matches!(eng.modify_qp(q, &rtr), Err(VerbsError::BadAttr(..))));
    rtr.peer = Some(PeerAddr { ip: IpAddrs::V6 { src: local, dst: remote }, mac: REMOTE_MAC });
    eng.modify_qp(q, &rtr).unwrap();
    eng.modify_qp(q, &QpAttr { sq_psn: Some(S), ..to(QpState::Rts) }).unwrap();
    eng.post_recv(q, 1, &[roce_dp::Sge { addr: 0, len: 64, lkey: mr.lkey }]).unwrap();
    let send = |src: [u8; 16]| {
        let mut r = RoceRepr { udp_dst: roce_dp::wire::ROCE_UDP_PORT, udp_src: 0xc000, ..RoceRepr::default() };
        r.ip.addrs = IpAddrs::V6 { src, dst: local };
        r.ip.ttl = 64;
        r.bth.opcode = Opcode::RC_SEND_ONLY;
        r.bth.dest_qp = q;
        r.bth.psn = roce_dp::wire::Psn::new(R);
        r.bth.ack_req = true;
        let mut buf = vec![0u8; 256];
        let n = emit_frame(&mut buf, &r, 8, |d| d.fill(7)).unwrap();
        buf.truncate(n);
        buf
    };
    let mut other = remote;
    other[15] = 3;
    eng.handle_rx(Instant(0), &send(other), RxMeta::default());
    assert_eq!(eng.stats().rx_drop_wrong_peer, 1);
    eng.handle_rx(Instant(0), &send(remote), RxMeta::default());
    let mut buf = vec![0u8; 9000];
    let n = eng.poll_transmit(Instant(0), &mut buf).expect("an ACK");
    let f = parse_frame(&buf[..n]).unwrap();
    assert!(f.icrc_ok);
    assert_eq!(f.repr.ip.addrs, IpAddrs::V6 { src: local, dst: remote });
    assert_eq!(
        (f.repr.bth.opcode, f.repr.bth.psn.value(), f.repr.ext.aeth.unwrap().msn),
        (Opcode::RC_ACKNOWLEDGE, R, 1)
    );
    assert_eq!(eng.poll_cq_one(cq).map(|c| (c.wr_id, c.status, c.byte_len)), Some((1, WcStatus::Success, 8)));
}

/// Session 14: QP numbers were reused last-freed-first, so a destroyed QP's number named the next QP created, and
/// anything still naming it (a completion left in a CQ, a peer's late packet) was taken for the new QP's. Numbers
/// now go round the engine's range (as rxe allocates its QP indices): a freed one comes back only after the rest.
#[test]
fn qp_numbers_are_not_reused_until_the_range_wraps() {
    use roce_dp::{Engine, EngineConfig, QpCaps};
    let mut e = Engine::new(EngineConfig { qpn_base: 0x11, max_qps: 4, ..EngineConfig::default() });
    let pd = e.alloc_pd();
    let cq = e.create_cq(16).unwrap();
    let mk = |e: &mut Engine| e.create_qp(pd, cq, cq, QpCaps::default());
    let a = mk(&mut e).unwrap();
    e.destroy_qp(a).unwrap();
    let b = mk(&mut e).unwrap();
    assert_ne!(b, a, "a destroyed QP's number was handed out again at once");
    let c = mk(&mut e).unwrap();
    e.destroy_qp(c).unwrap();
    assert_eq!([a, b, c], [0x11, 0x12, 0x13]);
    // 0x14 is the last never used; then the range wraps to the lowest free numbers, the newest freed last.
    let got: Vec<u32> = (0..3).map(|_| mk(&mut e).unwrap()).collect();
    assert_eq!(got, [0x14, 0x11, 0x13]);
    assert_eq!(mk(&mut e), Err(VerbsError::ResourceExhausted("queue pairs")));
    e.destroy_qp(0x12).unwrap();
    assert_eq!(mk(&mut e), Ok(0x12));
}

/// Session 14: a destroyed QP's completions stayed in its CQs and were polled after the destroy (with QP numbers
/// reused, as the completions of the QP that got its number). libmlx5's destroy cleans them out of the CQs
/// (`__mlx5_cq_clean`); the engine's destroy now does the same, and the other QPs' completions keep their order.
#[test]
fn a_destroyed_qps_completions_leave_its_cqs() {
    let mut p = Peer::new();
    let other = p.eng.create_qp(p.pd, p.scq, p.rcq, p.cfg.caps).unwrap();
    p.eng.modify_qp(other, &QpAttr { access: Some(AccessFlags::ALL), ..to(QpState::Init) }).unwrap();
    let s = p.sge(0, 8);
    for (qp, id) in [(p.qpn, 1), (other, 2), (p.qpn, 3), (other, 4), (p.qpn, 5)] {
        p.eng.post_recv(qp, id, &[s]).unwrap();
    }
    p.eng.modify_qp(p.qpn, &to(QpState::Err)).unwrap();
    p.eng.modify_qp(other, &to(QpState::Err)).unwrap();
    assert_eq!(p.eng.cq_len(p.rcq), 5);
    p.eng.destroy_qp(p.qpn).unwrap();
    let mut got = Vec::new();
    while let Some(c) = p.eng.poll_cq_one(p.rcq) {
        got.push((c.qpn, c.wr_id, c.status));
    }
    assert_eq!(got, [(other, 2, WcStatus::WrFlushErr), (other, 4, WcStatus::WrFlushErr)]);
}
