//! A second independent audit of the RC engine (session 10), written from ROCE-NOTES §1.4-§1.6 and §4 and from
//! verbs semantics, never from the code's outputs: every expected PSN, MSN, syndrome, opcode, offset and completion
//! below is computed in the test from those rules. Scripted frames and explicit time (harness::Peer), plus two
//! engines over the deterministic simulator where the bug only shows between two roce-dp ends.
//!
//! Areas: the RNR NAK as the one NAK of its gap; sequence NAKs during an RNR wait; READs that span half the PSN
//! space (2^31 bytes at MTU 256); fatal NAKs naming a WR behind a pending READ/atomic; fences and max_rd_atomic with
//! interleaved WRITEs; implicit acknowledgement by READ responses; mid-READ and mid-message resume across the wrap;
//! retry counter resets; next_deadline after each kind of event; posting in each state; hostile frames.

mod harness;

use harness::*;
use roce_dp::sim::{LinkConfig, Sim};
use roce_dp::wire::{self, AethRepr, NakCode, Opcode};
use roce_dp::{
    AccessFlags, AckPolicy, Duration, EngineConfig, Instant, QpAttr, QpCaps, QpState, SendWr, Sge, VerbsError,
    WcOpcode, WcStatus, WrOpcode,
};

/// The responder's first expected PSN (PeerCfg::default().rq_psn).
const R: u32 = 0x20_0000;
/// The requester's first PSN (PeerCfg::default().sq_psn).
const S: u32 = 0x10_0000;
const ACK: u8 = AethRepr::ACK_UNLIMITED;
const RVA: u64 = 0x7f00_0000_1000;
const RKEY: u32 = 0x1234;
/// PSNs are 24 bits (ROCE-NOTES §4.5).
const M: u32 = 0xff_ffff;

fn seq_nak() -> u8 {
    AethRepr::nak(NakCode::PsnSeqErr, 0).syndrome
}

/// RNR NAK syndrome: type 01 in bits 6:5, the timer code in bits 4:0 (ROCE-NOTES §4.3).
fn rnr(code: u8) -> u8 {
    0x20 | code
}

fn ops(v: &[Out]) -> Vec<(Opcode, u32)> {
    v.iter().map(|o| (o.op(), o.psn())).collect()
}

fn unsignaled(mut wr: SendWr) -> SendWr {
    wr.signaled = false;
    wr
}

// ============================================================================ RNR NAK and the sequence NAK
//
// ROCE-NOTES §1.5: the responder NAKs a gap once, then stays silent until the expected PSN arrives. An RNR NAK is a
// NAK naming the expected PSN (the requester goes back to it after the RNR timer): the packets of the same message
// that follow it are that gap, and qib/hfi1/ipath (r_nak_state, set by the RNR NAK) send no sequence NAK for them.
// A sequence NAK there would cost the requester a transport retry per RNR cycle.

#[test]
fn rnr_nak_is_the_one_nak_of_its_gap() {
    let mut p = Peer::with(PeerCfg { min_rnr_timer: 7, ..PeerCfg::default() });
    // A 3-packet SEND (MTU 1024) with no receive WQE: the FIRST gets the RNR NAK, MIDDLE and LAST nothing.
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.expect_ack(R, rnr(7), 0);
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R + 1).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 2).ack_req().fill(2048, 10));
    p.tx_nothing();
    assert_eq!(p.counters().nak_psn_seq_sent, 0);
    // The requester's retry after the RNR timer, with a receive WQE now: the message completes, MSN 1.
    p.post_recv(1, 0x4000, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R + 1).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 2).ack_req().fill(2048, 10));
    p.expect_ack(R + 2, ACK, 1);
    assert_recv(&p.cqes()[0], 1, 2058);
    // A new gap after that is NAKed once as before.
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 4).ack_req().reth(DATA_VA, p.data.rkey, 1).fill(0, 1));
    p.expect_ack(R + 3, seq_nak(), 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 5).ack_req().reth(DATA_VA, p.data.rkey, 1).fill(0, 1));
    p.tx_nothing();
}

#[test]
fn rnr_nak_at_the_wrap_then_the_rest_of_the_message_is_silent() {
    // The same across the PSN wrap: FIRST at 0xffffff, MIDDLE at 0, LAST at 1.
    let mut p = Peer::with(PeerCfg { rq_psn: M, min_rnr_timer: 1, ..PeerCfg::default() });
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, M).fill(0, 1024));
    p.expect_ack(M, rnr(1), 0);
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, 0).fill(1024, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, 1).ack_req().fill(2048, 4));
    p.tx_nothing();
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, M);
}

#[test]
fn a_sequence_nak_during_the_rnr_wait_spends_no_transport_retry() {
    // A responder that does send a sequence NAK after its RNR NAK (rxe does): the NAK names the PSN the requester is
    // already going back to after the RNR timer, so it is no new loss. retry_cnt = 0 (no transport retry at all),
    // rnr_retry = 7 (infinite): the SEND must not fail with RETRY_EXC_ERR.
    let mut p = Peer::with(PeerCfg { retry_cnt: 0, rnr_retry: 7, ..PeerCfg::default() });
    p.post_send(1, 0, 2100);
    assert_eq!(p.tx().len(), 3);
    for _ in 0..5 {
        p.rx(rnr_nak(S, 1, 0));
        p.rx(nak(S, NakCode::PsnSeqErr, 0));
        p.no_cqes();
        assert_eq!(p.state(), QpState::Rts);
        p.tx_nothing();
        // RNR timer code 1: 10 µs (ROCE-NOTES §4.4), then the whole message again from S.
        p.advance(Duration::from_micros(10));
        let v = p.tx();
        assert_eq!(
            ops(&v),
            vec![(Opcode::RC_SEND_FIRST, S), (Opcode::RC_SEND_MIDDLE, S + 1), (Opcode::RC_SEND_LAST, S + 2)],
            "{}",
            show(&v)
        );
    }
    p.rx(ack(S + 2, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
}

const SLOT: u64 = 8192;
const BASE: u64 = 0x100_0000;

/// Two engines over the simulator, one connected RC QP on each (node `n` sends from `psn[n]`), one region of
/// `region` bytes at BASE and one CQ per node.
struct Pair {
    sim: Sim,
    qp: [u32; 2],
    cq: [roce_dp::CqId; 2],
    mr: [roce_dp::MrKeys; 2],
}

/// The attributes of a [`Pair`] that tests vary.
#[derive(Clone, Copy, Debug)]
struct PairCfg {
    mtu: u32,
    psn: [u32; 2],
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: u8,
    timeout: u8,
    max_rd_atomic: [u8; 2],
    region: usize,
}

fn connect_pair(mut sim: Sim, c: PairCfg) -> Pair {
    let mut qp = [0; 2];
    let mut cq = [roce_dp::CqId(0); 2];
    let mut mr = [roce_dp::MrKeys { lkey: 0, rkey: 0 }; 2];
    for n in 0..2 {
        let e = &mut sim.nodes[n];
        let pd = e.alloc_pd();
        mr[n] = e.reg_mr(pd, BASE, c.region, AccessFlags::ALL).unwrap();
        cq[n] = e.create_cq(4096).unwrap();
        qp[n] = e.create_qp(pd, cq[n], cq[n], QpCaps::default()).unwrap();
    }
    for n in 0..2 {
        let e = &mut sim.nodes[n];
        let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        e.modify_qp(qp[n], &QpAttr { access: Some(AccessFlags::ALL), ..st(QpState::Init) }).unwrap();
        let rtr = QpAttr {
            path_mtu: Some(c.mtu),
            dest_qpn: Some(qp[1 - n]),
            rq_psn: Some(c.psn[1 - n]),
            max_dest_rd_atomic: Some(4),
            min_rnr_timer: Some(c.min_rnr_timer),
            peer: Some(Sim::peer_of(1 - n)),
            ..st(QpState::Rtr)
        };
        e.modify_qp(qp[n], &rtr).unwrap();
        let rts = QpAttr {
            sq_psn: Some(c.psn[n]),
            timeout: Some(c.timeout),
            retry_cnt: Some(c.retry_cnt),
            rnr_retry: Some(c.rnr_retry),
            max_rd_atomic: Some(c.max_rd_atomic[n]),
            ..st(QpState::Rts)
        };
        e.modify_qp(qp[n], &rts).unwrap();
    }
    Pair { sim, qp, cq, mr }
}

fn pair(mtu: u32, retry_cnt: u8, rnr_retry: u8, min_rnr_timer: u8) -> Pair {
    let sim = Sim::new(EngineConfig::default(), [LinkConfig::default(); 2], 1);
    let c = PairCfg {
        mtu,
        psn: [0x55, 0x55],
        retry_cnt,
        rnr_retry,
        min_rnr_timer,
        timeout: 12,
        max_rd_atomic: [4, 4],
        region: 1 << 20,
    };
    connect_pair(sim, c)
}

impl Pair {
    fn run_until(&mut self, t: Instant) {
        while self.sim.now < t {
            if !self.sim.step() {
                break;
            }
        }
    }
    fn cqes(&mut self, n: usize) -> Vec<roce_dp::Cqe> {
        let mut v = Vec::new();
        while let Some(c) = self.sim.nodes[n].poll_cq_one(self.cq[n]) {
            v.push(c);
        }
        v
    }
}

#[test]
fn rnr_retry_7_outlasts_a_slow_receiver_for_a_multi_packet_send_between_two_engines() {
    // retry_cnt 0 (no transport retry), rnr_retry 7 (infinite, ROCE-NOTES §4.6), min_rnr_timer 1 (10 µs). The receiver posts
    // its receive WQE only after 2 ms: about 100 RNR cycles. The 3-packet SEND then completes on both sides.
    let mut pr = pair(1024, 0, 7, 1);
    let s = Sge { addr: BASE, len: 2100, lkey: pr.mr[0].lkey };
    pr.sim.nodes[0].post_send(pr.qp[0], &SendWr::new(7, WrOpcode::Send), &[s]).unwrap();
    pr.sim.kick(0);
    pr.run_until(Instant::ZERO + Duration::from_micros(2000));
    assert!(pr.cqes(0).is_empty(), "the SEND must still be waiting for its receiver");
    let rnrs = pr.sim.nodes[0].qp_counters(pr.qp[0]).unwrap().rnr_nak_rcvd;
    assert!(rnrs >= 50, "expected many RNR cycles, got {rnrs}");
    let r = Sge { addr: BASE, len: 4096, lkey: pr.mr[1].lkey };
    pr.sim.nodes[1].post_recv(pr.qp[1], 9, &[r]).unwrap();
    pr.run_until(Instant::ZERO + Duration::from_micros(4000));
    let c0 = pr.cqes(0);
    assert_eq!(c0.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(), vec![(7, WcStatus::Success)]);
    let c1 = pr.cqes(1);
    assert_eq!(
        c1.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect::<Vec<_>>(),
        vec![(9, WcStatus::Success, 2100)]
    );
}

// ============================================================================ a READ spanning half the PSN space
//
// A message may be 2^31 bytes (ROCE-NOTES §1.6, C9-... RETH length <= 2^31); a READ takes ceil(len / MTU) PSNs
// (§4.5), so 2^31 bytes at MTU 256 take 2^23 PSNs: exactly half the 24-bit space. Its responses carry PSNs
// first..first + 2^23 - 1, all of them sent and not yet acknowledged.

/// A 64 MiB region and 32 SGEs over it: 2^31 bytes of local READ buffer without 2 GiB of memory.
fn sgl_of_2_31(p: &mut Peer) -> Vec<Sge> {
    let big = p.eng.reg_mr(p.pd, 0x1_0000_0000, 1 << 26, AccessFlags::ALL).unwrap();
    (0..32).map(|_| Sge { addr: 0x1_0000_0000, len: 1 << 26, lkey: big.lkey }).collect()
}

#[test]
fn a_read_of_2_31_bytes_at_mtu_256_is_outstanding_until_answered() {
    let caps = QpCaps { max_send_sge: 32, ..QpCaps::default() };
    let mut p = Peer::with(PeerCfg { mtu: 256, caps, ..PeerCfg::default() });
    let sgl = sgl_of_2_31(&mut p);
    p.post(SendWr::new(1, WrOpcode::RdmaRead).remote(RVA, RKEY), &sgl);
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.reth().len), (Opcode::RC_RDMA_READ_REQUEST, S, 1 << 31));
    // Outstanding: the local ACK timer runs, and when it fires the READ is asked for again (go-back-N to S).
    let t0 = p.now;
    assert_eq!(p.deadline(), Some(t0 + p.cfg.ack_timeout()), "the READ must arm the local ACK timer");
    p.fire();
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.reth().len), (Opcode::RC_RDMA_READ_REQUEST, S, 1 << 31));
    // Its first response (PSN S, 256 bytes) is a response to it, not a bogus PSN; the last PSN it can have
    // (S + 2^23 - 1) is within what was sent too: a LAST there is the wrong length, a bad response for the READ.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(ACK, 1).fill(0, 256));
    assert_eq!(p.counters().bad_responses, 0, "a response at the READ's first PSN is no bogus PSN");
    p.no_cqes();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, S + 1).fill(256, 256));
    p.no_cqes();
    assert_eq!(p.state(), QpState::Rts);
    assert_eq!(p.deadline(), Some(p.now + p.cfg.ack_timeout()), "progress re-arms the timer");
}

/// The next `n` frames the engine sends (not all of them: a 2^31-byte READ answers with 2^23).
fn take(p: &mut Peer, n: usize) -> Vec<Out> {
    let mut v = Vec::new();
    let mut buf = vec![0u8; BUF_LEN];
    while v.len() < n {
        let Some(len) = p.eng.poll_transmit(p.now, &mut buf) else { break };
        let f = wire::parse_frame(&buf[..len]).unwrap();
        assert!(f.icrc_ok);
        v.push(Out { repr: f.repr, payload: f.payload.to_vec(), raw: buf[..len].to_vec() });
    }
    v
}

#[test]
fn a_responder_serves_a_read_of_2_31_bytes_at_mtu_256_and_its_duplicate_from_the_middle() {
    let mut p = Peer::with(PeerCfg { mtu: 256, ..PeerCfg::default() });
    // 2 GiB of address space; only the pages read are ever touched.
    let big = p.eng.reg_mr(p.pd, 0x1_0000_0000, 1 << 31, AccessFlags::ALL).unwrap();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(0x1_0000_0000, big.rkey, 1 << 31));
    let v = take(&mut p, 3);
    let got: Vec<(Opcode, u32, usize)> = v.iter().map(|f| (f.op(), f.psn(), f.payload.len())).collect();
    assert_eq!(
        got,
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, R, 256),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, R + 1, 256),
            (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, R + 2, 256)
        ]
    );
    // The READ took 2^23 PSNs: the next request is expected at R + 2^23 (mod 2^24).
    let next = (R + (1 << 23)) & M;
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, next);
    // A duplicate asking again from R + 5 (va and length moved by 5 packets): re-executed from there.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 5).ack_req().reth(
        0x1_0000_0000 + 5 * 256,
        big.rkey,
        (1 << 31) - 5 * 256,
    ));
    let v = take(&mut p, 2);
    let got: Vec<(Opcode, u32)> = ops(&v);
    assert_eq!(got, vec![(Opcode::RC_RDMA_READ_RESPONSE_FIRST, R + 5), (Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, R + 6)]);
    assert_eq!(v[0].repr.ext.aeth.map(|a| a.msn), Some(1));
    assert_eq!(p.state(), QpState::Rts);
}

// ============================================================================ fatal NAKs behind a pending READ/atomic
//
// A NAK names the PSN of the request that failed (ROCE-NOTES §4.3: 0x61/0x62/0x63 complete with REM_INV_REQ_ERR /
// REM_ACCESS_ERR / REM_OP_ERR and move the QP to ERR). The NAK implicitly acknowledges what precedes it, but a READ
// or atomic before it is not done without its response data, which was lost: the error belongs to the WR the NAK
// names, never to the READ/atomic before it (which ends flushed, its data never having arrived), as the engine
// reports a local error on the WR that caused it.

#[test]
fn a_fatal_nak_beyond_a_pending_read_fails_the_wr_it_names() {
    for (code, status) in [
        (NakCode::RemoteAccessErr, WcStatus::RemAccessErr),
        (NakCode::InvalidRequest, WcStatus::RemInvReqErr),
        (NakCode::RemoteOpErr, WcStatus::RemOpErr),
    ] {
        let mut p = Peer::new();
        p.post_read(1, 0x1000, 2048, RVA, RKEY); // S, S+1
        p.post_write(2, 0, 100, RVA, 0xbad); // S+2
        p.post_send(3, 0, 10); // S+3
        assert_eq!(
            ops(&p.tx()),
            vec![(Opcode::RC_RDMA_READ_REQUEST, S), (Opcode::RC_RDMA_WRITE_ONLY, S + 2), (Opcode::RC_SEND_ONLY, S + 3)]
        );
        p.rx(nak(S + 2, code, 1));
        let c = p.expect_cqes(&[(1, WcStatus::WrFlushErr), (2, status), (3, WcStatus::WrFlushErr)]);
        assert_eq!((c[0].opcode, c[1].opcode), (WcOpcode::RdmaRead, WcOpcode::RdmaWrite));
        assert_eq!(p.state(), QpState::Err);
        p.tx_nothing();
        assert_eq!(p.deadline(), None);
    }
}

#[test]
fn a_fatal_nak_beyond_a_pending_atomic_across_the_wrap_fails_the_wr_it_names() {
    // FETCH_ADD at 0xffffff, SEND at 0 NAKed (invalid request): the atomic flushed, the SEND failed.
    let mut p = Peer::with(PeerCfg { sq_psn: M, ..PeerCfg::default() });
    p.post_fetch_add(1, 0x100, RVA, RKEY, 1);
    p.post_send(2, 0, 10);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_FETCH_ADD, M), (Opcode::RC_SEND_ONLY, 0)]);
    p.rx(nak(0, NakCode::InvalidRequest, 1));
    p.expect_cqes(&[(1, WcStatus::WrFlushErr), (2, WcStatus::RemInvReqErr)]);
    assert_eq!(p.state(), QpState::Err);
}

#[test]
fn a_fatal_nak_inside_a_read_fails_that_read_and_completes_the_writes_before_it() {
    // WRITE at S (unacknowledged), READ at S+1..S+3 (MTU 1024, 3000 B): the responder's NAK at S+2 (the region was
    // invalidated while it served the READ) acknowledges the WRITE (success) and fails the READ itself.
    let mut p = Peer::new();
    p.post_write(1, 0, 10, RVA, RKEY);
    p.post_read(2, 0x1000, 3000, RVA, RKEY);
    p.post_send(3, 0, 10);
    assert_eq!(p.tx().len(), 3);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S + 1).aeth(ACK, 2).fill(0, 1024));
    p.rx(nak(S + 2, NakCode::RemoteAccessErr, 2));
    p.expect_cqes(&[(1, WcStatus::Success), (2, WcStatus::RemAccessErr), (3, WcStatus::WrFlushErr)]);
}

// ============================================================================ requester: fences, max_rd_atomic

#[test]
fn a_fenced_wr_waits_for_the_read_before_it_and_an_unfenced_one_does_not() {
    // IBV_SEND_FENCE: the WR starts only when every earlier READ/atomic has completed.
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 16, RVA, RKEY); // S
    p.post_write(2, 0, 8, RVA, RKEY); // S+1, no fence: leaves at once
    let mut wr = SendWr::new(3, WrOpcode::Send);
    wr.fence = true;
    let s = p.sge(0, 8);
    p.post(wr, &[s]); // S+2, fenced
    p.post_send(4, 0, 8); // behind the fenced one
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_RDMA_READ_REQUEST, S), (Opcode::RC_RDMA_WRITE_ONLY, S + 1)]);
    p.rx(ack(S + 1, 2)); // beyond the READ: its response was lost, go back to it
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_READ_REQUEST, S), (Opcode::RC_RDMA_WRITE_ONLY, S + 1)], "{}", show(&v));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(ACK, 1).fill(0, 16));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S + 2), (Opcode::RC_SEND_ONLY, S + 3)]);
    p.rx(ack(S + 3, 4));
    p.expect_cqes(&[(2, WcStatus::Success), (3, WcStatus::Success), (4, WcStatus::Success)]);
}

#[test]
fn max_rd_atomic_one_with_interleaved_writes() {
    // max_rd_atomic = 1: READ 1 and the WRITE after it leave; READ 2 waits for READ 1, and the WRITE after READ 2
    // waits behind it (WRs start in order).
    let mut p = Peer::with(PeerCfg { max_rd_atomic: 1, ..PeerCfg::default() });
    p.post_read(1, 0x1000, 16, RVA, RKEY);
    p.post_write(2, 0, 8, RVA, RKEY);
    p.post_read(3, 0x2000, 16, RVA, RKEY);
    p.post_write(4, 0, 8, RVA, RKEY);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_RDMA_READ_REQUEST, S), (Opcode::RC_RDMA_WRITE_ONLY, S + 1)]);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(ACK, 1).fill(0, 16));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_RDMA_READ_REQUEST, S + 2), (Opcode::RC_RDMA_WRITE_ONLY, S + 3)]);
    // READ 2's response implicitly acknowledges the WRITE before it (a response at PSN p acknowledges every
    // SEND/WRITE packet before p); the last ACK completes WRITE 4.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S + 2).aeth(ACK, 3).fill(0, 16));
    p.expect_cqes(&[(2, WcStatus::Success), (3, WcStatus::Success)]);
    p.rx(ack(S + 3, 4));
    p.expect_cqes(&[(4, WcStatus::Success)]);
    assert_eq!(p.deadline(), None);
}

#[test]
fn an_ack_naming_a_psn_inside_a_partly_answered_read_resumes_it_at_the_right_offset() {
    // READ of 3500 B (MTU 1024: S..S+3). FIRST and MIDDLE arrive, then an ACK naming S+3 (the READ's last PSN: the
    // responder re-ACKed a duplicate). The READ's remaining responses are lost: it is asked for again from S+2,
    // at va + 2048 for 3500 - 2048 bytes, and completes with the right bytes.
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 3500, RVA, RKEY);
    p.tx_one();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S).aeth(ACK, 1).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_MIDDLE, S + 1).fill(1024, 1024));
    p.rx(ack(S + 3, 1));
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn()), (Opcode::RC_RDMA_READ_REQUEST, S + 2));
    assert_eq!(o.reth(), wire::RethRepr { va: RVA + 2048, rkey: RKEY, len: 3500 - 2048 });
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_FIRST, S + 2).aeth(ACK, 1).fill(2048, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_LAST, S + 3).aeth(ACK, 1).fill(3072, 428));
    let c = p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(c[0].byte_len, 3500);
    let want: Vec<u8> = (0..3500).map(pattern).collect();
    assert_eq!(&p.data()[0x1000..0x1000 + 3500], &want[..]);
}

#[test]
fn timeout_in_the_middle_of_a_write_spanning_the_wrap_resends_from_the_middle() {
    // WRITE of 3000 B at 0xfffffe: FIRST 0xfffffe (RETH), MIDDLE 0xffffff, LAST 0. The ACK of 0xfffffe arrives, the
    // rest is lost: on the timeout, MIDDLE at 0xffffff (no RETH, bytes 1024..2048) and LAST at 0 (bytes 2048..3000).
    let mut p = Peer::with(PeerCfg { sq_psn: M - 1, ..PeerCfg::default() });
    p.fill_data();
    p.post_write(1, 0x200, 3000, RVA, RKEY);
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![(Opcode::RC_RDMA_WRITE_FIRST, M - 1), (Opcode::RC_RDMA_WRITE_MIDDLE, M), (Opcode::RC_RDMA_WRITE_LAST, 0)]
    );
    p.rx(ack(M - 1, 0));
    p.fire();
    let v = p.tx();
    assert_eq!(ops(&v), vec![(Opcode::RC_RDMA_WRITE_MIDDLE, M), (Opcode::RC_RDMA_WRITE_LAST, 0)], "{}", show(&v));
    assert!(v[0].repr.ext.reth.is_none());
    assert!(v[1].repr.bth.ack_req, "AckReq on the last packet of the message");
    assert_eq!(&v[0].payload[..], &p.data()[0x200 + 1024..0x200 + 2048]);
    assert_eq!(&v[1].payload[..], &p.data()[0x200 + 2048..0x200 + 3000]);
    assert_eq!(p.counters().retransmitted_packets, 2);
    p.rx(ack(0, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
}

// ============================================================================ requester: retry counters

#[test]
fn the_retry_counter_restarts_after_progress() {
    // retry_cnt = 1: one retry per stretch without progress. Timeout (retry 1 of 1), an ACK of the first packet
    // (progress: the counter restarts), timeout (retry 1 of 1 again), timeout: RETRY_EXC_ERR.
    let mut p = Peer::with(PeerCfg { retry_cnt: 1, ..PeerCfg::default() });
    p.post_send(1, 0, 3000);
    assert_eq!(p.tx().len(), 3);
    p.fire();
    assert_eq!(p.tx().len(), 3);
    p.rx(ack(S, 0));
    p.fire();
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_MIDDLE, S + 1), (Opcode::RC_SEND_LAST, S + 2)]);
    p.no_cqes();
    p.fire();
    p.expect_cqes(&[(1, WcStatus::RetryExcErr)]);
    assert_eq!(p.state(), QpState::Err);
    assert_eq!(p.deadline(), None);
}

#[test]
fn rnr_retry_7_is_infinite_and_rnr_retry_2_allows_two_retries() {
    let mut p = Peer::with(PeerCfg { rnr_retry: 7, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.tx_one();
    for _ in 0..100 {
        p.rx(rnr_nak(S, 1, 0));
        p.advance(Duration::from_micros(10));
        assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S)]);
    }
    p.no_cqes();
    p.rx(ack(S, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);

    let mut p = Peer::with(PeerCfg { rnr_retry: 2, ..PeerCfg::default() });
    p.post_send(1, 0, 10);
    p.post_send(2, 0, 10);
    assert_eq!(p.tx().len(), 2);
    for _ in 0..2 {
        p.rx(rnr_nak(S, 1, 0));
        p.advance(Duration::from_micros(10));
        assert_eq!(p.tx().len(), 2);
    }
    p.rx(rnr_nak(S, 1, 0));
    p.expect_cqes(&[(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]);
}

// ============================================================================ QP states and posting

#[test]
fn posting_in_reset_init_rtr_is_refused_and_err_flushes() {
    let mut p = Peer::new();
    let q = p.qpn;
    p.eng.modify_qp(q, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    let s = p.sge(0, 8);
    let send = SendWr::new(1, WrOpcode::Send);
    assert_eq!(p.eng.post_send(q, &send, &[s]), Err(VerbsError::BadState(QpState::Reset)));
    assert_eq!(p.eng.post_recv(q, 1, &[s]), Err(VerbsError::BadState(QpState::Reset)));
    p.eng
        .modify_qp(q, &QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() })
        .unwrap();
    assert_eq!(p.eng.post_send(q, &send, &[s]), Err(VerbsError::BadState(QpState::Init)));
    p.eng.post_recv(q, 2, &[s]).unwrap();
    let rtr = p.rtr_attr();
    p.eng.modify_qp(q, &rtr).unwrap();
    assert_eq!(p.eng.post_send(q, &send, &[s]), Err(VerbsError::BadState(QpState::Rtr)));
    p.eng.post_recv(q, 3, &[s]).unwrap();
    p.tx_nothing();
    // To ERR: both posted receives flush, in order; then a post_send completes at once with WR_FLUSH_ERR.
    p.eng.modify_qp(q, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    p.expect_cqes(&[(2, WcStatus::WrFlushErr), (3, WcStatus::WrFlushErr)]);
    p.eng.post_send(q, &SendWr::new(4, WrOpcode::RdmaWrite).remote(RVA, RKEY), &[s]).unwrap();
    let c = p.expect_cqes(&[(4, WcStatus::WrFlushErr)]);
    assert_eq!(c[0].opcode, WcOpcode::RdmaWrite);
    p.tx_nothing();
    assert_eq!(p.deadline(), None);
}

#[test]
fn modify_to_err_with_wrs_in_flight_and_queued_flushes_them_in_order() {
    let mut p = Peer::new();
    p.post_send(1, 0, 3000); // 3 packets in flight
    p.post_recv(10, 0, 64);
    p.tx();
    p.post_read(2, 0x1000, 64, RVA, RKEY); // not yet sent
    p.post(unsignaled(SendWr::new(3, WrOpcode::Send)), &[p.sge(0, 8)]);
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    // Every WR completes with WR_FLUSH_ERR, the unsignaled one too (errors are always reported).
    p.expect_cqes(&[
        (1, WcStatus::WrFlushErr),
        (2, WcStatus::WrFlushErr),
        (3, WcStatus::WrFlushErr),
        (10, WcStatus::WrFlushErr),
    ]);
    p.tx_nothing();
    assert_eq!(p.deadline(), None);
    // A late ACK for the flushed SEND changes nothing.
    p.rx(ack(S + 2, 1));
    p.no_cqes();
    p.tx_nothing();
}

#[test]
fn sqd_holds_new_wrs_until_back_to_rts() {
    let mut p = Peer::new();
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Sqd), ..QpAttr::default() }).unwrap();
    p.post_send(1, 0, 8);
    p.tx_nothing();
    assert_eq!(p.deadline(), None, "nothing sent, no timer");
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Rts), ..QpAttr::default() }).unwrap();
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S)]);
    p.rx(ack(S, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
}

// ============================================================================ timers: the next deadline after each event

#[test]
fn next_deadline_follows_every_requester_event() {
    let mut p = Peer::with(PeerCfg { rnr_retry: 7, ..PeerCfg::default() });
    let t = p.cfg.ack_timeout();
    assert_eq!(p.deadline(), None, "an idle QP arms nothing");
    p.post_send(1, 0, 3000);
    assert_eq!(p.deadline(), None, "a post arms nothing before a packet leaves");
    p.tx();
    assert_eq!(p.deadline(), Some(p.now + t));
    // A partial ACK later: the timer restarts from the ACK. (poll_timeout may report the superseded, earlier
    // deadline: a call then is a no-op that leaves the real one, never one in the past.)
    let first_due = p.now + t;
    p.advance(Duration::from_micros(100));
    p.rx(ack(S, 0));
    let due = p.now + t;
    // An ACK that moves nothing (a duplicate) does not push the deadline.
    p.advance(Duration::from_micros(100));
    p.rx(ack(S, 0));
    p.advance_to(first_due);
    p.tx_nothing();
    assert_eq!(p.deadline(), Some(due));
    // RNR NAK at S+1 (code 3: 30 µs): the only deadline is the RNR timer; the local ACK timer waits for the resend.
    p.rx(rnr_nak(S + 1, 3, 0));
    let rnr_due = p.now + Duration::from_micros(30);
    assert_eq!(p.deadline(), Some(rnr_due));
    p.fire();
    assert_eq!(p.now, rnr_due);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_MIDDLE, S + 1), (Opcode::RC_SEND_LAST, S + 2)]);
    assert_eq!(p.deadline(), Some(rnr_due + t));
    // The final ACK: nothing outstanding, no deadline.
    p.rx(ack(S + 2, 1));
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(p.deadline(), None);
    // A timeout that retransmits re-arms the timer a full timeout later, never in the past.
    p.post_send(2, 0, 8);
    p.tx();
    let d = p.fire();
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S + 3)]);
    assert_eq!(p.deadline(), Some(d + t));
}

#[test]
fn next_deadline_of_the_ack_coalescing_timer_and_count() {
    // max_pkts 3, delay 20 µs: the third AckReq'd packet sends the ACK at once and stops the timer; a single one
    // leaves at its deadline.
    let ack_pol = AckPolicy { max_pkts: 3, max_delay: Duration::from_micros(20) };
    let mut p = Peer::with(PeerCfg { ack: ack_pol, ..PeerCfg::default() });
    let k = p.data.rkey;
    let t0 = p.now;
    for i in 0..3 {
        p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + i).ack_req().reth(DATA_VA, k, 4).fill(0, 4));
        if i < 2 {
            assert_eq!(p.deadline(), Some(t0 + Duration::from_micros(20)));
            p.tx_nothing();
        }
    }
    p.expect_ack(R + 2, ACK, 3);
    assert_eq!(p.deadline(), None);
    p.advance(Duration::from_micros(3));
    let t1 = p.now;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R + 3).ack_req().reth(DATA_VA, k, 4).fill(0, 4));
    assert_eq!(p.deadline(), Some(t1 + Duration::from_micros(20)));
    assert_eq!(p.fire(), t1 + Duration::from_micros(20));
    p.expect_ack(R + 3, ACK, 4);
    assert_eq!(p.deadline(), None);
}

#[test]
fn a_qp_moved_to_reset_or_err_leaves_no_deadline_behind_and_the_next_life_works() {
    let mut p = Peer::new();
    p.post_send(1, 0, 8);
    p.tx();
    assert!(p.deadline().is_some());
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    assert_eq!(p.deadline(), None);
    p.no_cqes();
    p.bring_up();
    p.post_send(2, 0, 8);
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_SEND_ONLY, S)]);
    assert_eq!(p.deadline(), Some(p.now + p.cfg.ack_timeout()));
    p.rx(ack(S, 1));
    p.expect_cqes(&[(2, WcStatus::Success)]);
}

// ============================================================================ responder

#[test]
fn write_with_immediate_over_three_packets_consumes_one_receive_wqe_at_its_last_packet() {
    // The receive WQE is needed only at the LAST_WITH_IMM (RWR); its buffer is not written; byte_len is the
    // WRITE's length (RETH), imm the ImmDt; the data lands at the RETH's va.
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA + 0x100, k, 2500).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_MIDDLE, R + 1).fill(1024, 1024));
    p.tx_nothing();
    p.post_recv(5, 0x8000, 16);
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE, R + 2).ack_req().imm(0xfeed).fill(2048, 452));
    p.expect_ack(R + 2, ACK, 1);
    let c = p.cqes();
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode, c[0].byte_len, c[0].imm),
        (5, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 2500, Some(0xfeed))
    );
    let want: Vec<u8> = (0..2500).map(pattern).collect();
    assert_eq!(&p.data()[0x100..0x100 + 2500], &want[..]);
    assert!(p.data()[0x8000..0x8010].iter().all(|&b| b == 0), "the receive buffer is not written");
}

#[test]
fn send_with_invalidate_of_our_key_of_another_pds_key_and_of_a_local_only_key() {
    // Our PD's remote key: invalidated, the receive completion names it.
    let mut p = Peer::new();
    let t = p.eng.reg_mr(p.pd, 0x90_0000, 4096, AccessFlags::ALL).unwrap();
    p.post_recv(1, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R).ack_req().ieth(t.rkey).fill(0, 8));
    p.expect_ack(R, ACK, 1);
    let c = p.cqes();
    assert_eq!((c[0].status, c[0].invalidated_rkey, c[0].byte_len), (WcStatus::Success, Some(t.rkey), 8));
    // A key of another PD and a local-only key may not be invalidated by the peer: NAK invalid request, the QP to
    // ERR, the region still valid.
    for other_pd in [true, false] {
        let mut p = Peer::new();
        let pd = if other_pd { p.eng.alloc_pd() } else { p.pd };
        let access = if other_pd { AccessFlags::ALL } else { AccessFlags::LOCAL_WRITE };
        let t = p.eng.reg_mr(pd, 0x90_0000, 4096, access).unwrap();
        p.post_recv(1, 0, 64);
        p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R).ack_req().ieth(t.rkey).fill(0, 8));
        p.expect_nak(R, NakCode::InvalidRequest);
        assert_eq!(p.state(), QpState::Err);
        let c = p.cqes();
        assert_eq!(c.len(), 1, "{c:?}");
        assert_ne!(c[0].status, WcStatus::Success);
        assert!(p.eng.mr_bytes(t.lkey).is_some());
        // The key still works locally: a local SGE with it is valid.
        assert!(p.eng.dereg_mr(t.lkey));
    }
}

#[test]
fn zero_length_read_with_rkey_zero_is_answered_and_a_zero_length_read_completes() {
    // C9-88 (ROCE-NOTES §1.6): a zero-length READ needs no valid rkey; one empty READ_RESPONSE_ONLY with the MSN.
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(0, 0, 0));
    let o = p.tx_one();
    assert_eq!(
        (o.op(), o.psn(), o.payload.len(), o.aeth()),
        (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R, 0, AethRepr::ack(1))
    );
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R + 1, "a zero-length READ takes one PSN");
    // And the requester side: one PSN, one empty ONLY response, byte_len 0.
    p.post(SendWr::new(1, WrOpcode::RdmaRead).remote(0, 0), &[]);
    let o = p.tx_one();
    assert_eq!((o.op(), o.psn(), o.reth().len), (Opcode::RC_RDMA_READ_REQUEST, S, 0));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(ACK, 1));
    let c = p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!((c[0].opcode, c[0].byte_len), (WcOpcode::RdmaRead, 0));
}

#[test]
fn duplicate_send_middle_packets_are_reacked_and_change_nothing() {
    let mut p = Peer::new();
    p.post_recv(1, 0x4000, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R + 1).fill(1024, 1024));
    p.tx_nothing();
    // Duplicates of the FIRST and the MIDDLE (C9-105: acknowledged again with the last accepted PSN, MSN 0).
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.expect_ack(R + 1, ACK, 0);
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R + 1).payload(&[0xee; 1024]));
    p.expect_ack(R + 1, ACK, 0);
    p.rx(Pkt::new(Opcode::RC_SEND_LAST, R + 2).ack_req().fill(2048, 100));
    p.expect_ack(R + 2, ACK, 1);
    assert_recv(&p.cqes()[0], 1, 2148);
    let want: Vec<u8> = (0..2148).map(pattern).collect();
    assert_eq!(&p.data()[0x4000..0x4000 + 2148], &want[..]);
}

#[test]
fn a_duplicate_read_from_the_middle_of_one_still_queued_restarts_from_there_and_later_ones_follow() {
    // READ A at R..R+3 (MTU 256, 1000 B) and READ B at R+4 queued; nothing sent. The requester asks again from
    // R+2 (va + 512, 488 B): A's responses restart at R+2 (FIRST) and end at R+3 (LAST), MSN 1; B (MSN 2) is asked
    // for again by the requester's go-back-N and served after.
    let mut p = Peer::with(PeerCfg { mtu: 256, ..PeerCfg::default() });
    p.fill_data();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 1000));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 4).ack_req().reth(DATA_VA + 0x2000, k, 16));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 2).ack_req().reth(DATA_VA + 512, k, 488));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 4).ack_req().reth(DATA_VA + 0x2000, k, 16));
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, R + 2),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, R + 3),
            (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R + 4)
        ],
        "{}",
        show(&v)
    );
    assert_eq!((v[0].aeth().msn, v[1].aeth().msn, v[2].aeth().msn), (1, 1, 2));
    assert_eq!(&v[0].payload[..], &p.data()[512..768]);
    assert_eq!(&v[1].payload[..], &p.data()[768..1000]);
    assert_eq!(&v[2].payload[..], &p.data()[0x2000..0x2010]);
}

#[test]
fn an_ack_with_a_credit_count_is_an_ack() {
    // AETH syndromes 0x00-0x1F are ACKs; the low five bits are a credit count (0x1F: none advertised).
    for syndrome in [0x00u8, 0x05, 0x1e] {
        let mut p = Peer::new();
        p.post_send(1, 0, 8);
        p.tx();
        p.rx(Pkt::new(Opcode::RC_ACKNOWLEDGE, S).aeth(syndrome, 1));
        p.expect_cqes(&[(1, WcStatus::Success)]);
    }
}

// ============================================================================ hostile frames

#[test]
fn valid_frames_from_another_source_or_to_a_qp_in_reset_init_err_are_dropped() {
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.post_recv(1, 0, 64);
    p.post_send(2, 0, 8);
    p.tx();
    let before = p.data().to_vec();
    let reqs = [
        Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8),
        Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, k, 8).fill(0, 8),
        Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 8),
        Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 1, 0),
        Pkt::new(Opcode::RC_SEND_ONLY, R + 9).ack_req().fill(0, 8),
        ack(S, 1),
        nak(S, NakCode::RemoteAccessErr, 1),
    ];
    for pkt in &reqs {
        let f = p.frame_from(pkt, [10, 0, 0, 3]);
        p.rx_raw(&f);
    }
    assert_eq!(p.eng.stats().rx_drop_wrong_peer, reqs.len() as u64);
    p.tx_nothing();
    p.no_cqes();
    assert_eq!(p.state(), QpState::Rts);
    assert!(p.data() == &before[..]);
    // The same frames from the peer to a QP in RESET and in INIT: dropped, nothing answered or written.
    for st in [QpState::Reset, QpState::Init] {
        let mut p = Peer::new();
        p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
        if st == QpState::Init {
            p.eng
                .modify_qp(
                    p.qpn,
                    &QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() },
                )
                .unwrap();
            p.post_recv(1, 0, 64);
        }
        let before = p.data().to_vec();
        for pkt in &reqs {
            p.rx(pkt.clone());
        }
        assert_eq!(p.eng.stats().rx_drop_bad_state, reqs.len() as u64, "{st:?}");
        p.tx_nothing();
        p.no_cqes();
        assert!(p.data() == &before[..]);
        assert_eq!(p.state(), st);
    }
}

#[test]
fn uc_and_ud_opcodes_to_an_rc_qp_are_dropped() {
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.post_recv(1, 0, 64);
    let before = p.data().to_vec();
    p.rx(Pkt::new(Opcode::UC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.rx(Pkt::new(Opcode::UC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA, k, 8).fill(0, 8));
    let mut ud = Pkt::new(Opcode::UD_SEND_ONLY, R).fill(0, 8);
    ud.ext.deth = Some(wire::DethRepr { qkey: 1, src_qp: REMOTE_QPN });
    p.rx(ud);
    p.tx_nothing();
    p.no_cqes();
    assert!(p.data() == &before[..]);
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().rq_psn, R);
    // The RC SEND at R still works.
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    p.expect_ack(R, ACK, 1);
}

#[test]
fn reth_lengths_at_the_limits_and_a_misaligned_atomic() {
    // RETH length 2^31: allowed by the length check (C9-... <= 2^31), refused by the region bounds (remote access);
    // 2^31 + 1 and 2^32 - 1: length errors (invalid request). A WRITE_FIRST announcing 2^32 - 1: invalid request.
    let k = Peer::new().data.rkey;
    for (pkt, code) in [
        (Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 1 << 31), NakCode::RemoteAccessErr),
        (Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, (1 << 31) + 1), NakCode::InvalidRequest),
        (Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, u32::MAX), NakCode::InvalidRequest),
        (Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, k, u32::MAX).fill(0, 1024), NakCode::InvalidRequest),
        (Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, k, 1 << 31).fill(0, 1024), NakCode::RemoteAccessErr),
        (Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA + 4, k, 1, 0), NakCode::InvalidRequest),
        (Pkt::new(Opcode::RC_COMPARE_SWAP, R).ack_req().atomic(DATA_VA + 1, k, 1, 0), NakCode::InvalidRequest),
    ] {
        let mut p = Peer::new();
        let before = p.data().to_vec();
        let show_pkt = format!("{pkt:?}");
        p.rx(pkt);
        p.expect_nak(R, code);
        assert_eq!(p.state(), QpState::Err, "{show_pkt}");
        assert!(p.data() == &before[..]);
        p.assert_guards();
    }
}

#[test]
fn a_frame_for_another_local_address_or_qp_is_not_delivered() {
    let mut p = Peer::new();
    p.post_recv(1, 0, 64);
    let mut f = p.frame(&Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8));
    // To 10.0.0.9 instead of our 10.0.0.1 (IPv4 destination at offset 30; checksum and ICRC recomputed).
    f[33] = 9;
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    wire::Ipv4Packet::new_unchecked(&mut f[14..34]).fill_checksum();
    wire::icrc::fill(&mut f[14..14 + total]).unwrap();
    p.rx_raw(&f);
    assert_eq!(p.eng.stats().rx_drop_not_for_us, 1);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 8).dest_qp(p.qpn + 7));
    assert_eq!(p.eng.stats().rx_drop_unknown_qp, 1);
    p.tx_nothing();
    p.no_cqes();
}

// ============================================================================ differential: two engines vs a model
//
// Random WR mixes (SEND, SEND with immediate, WRITE, WRITE with immediate, READ, FETCH_ADD, CMP_SWP; 0..5000 bytes;
// fences; unsignaled WRs) from node 0 to node 1 over lossy, duplicating, reordering, corrupting links, with node 1
// posting its receive WQEs late (RNR NAKs) and random max_rd_atomic / MTU / RNR timer. The model is the verbs
// semantics: every signaled WR completes with SUCCESS in posting order and every unsignaled one silently; receive
// completions in message order with their byte_len, opcode and immediate; WRITE and SEND data at the destination,
// READ data at the source; atomics executed once each, in order, against one counter. ROCE_SIM_SEED=S replays one.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    FetchAdd,
    CmpSwp,
}

fn fill(seed: u64, d: usize, k: usize, n: usize) -> Vec<u8> {
    let x = (seed as usize).wrapping_mul(31).wrapping_add(d * 977).wrapping_add(k * 131);
    (0..n).map(|i| x.wrapping_add(i * 7).wrapping_add(i >> 8) as u8).collect()
}

/// Slot k of a node's region: its own WR k's local buffer (0..64), receive buffer j (64..128), the peer's WR k's
/// remote target (128..192), the atomic counter (192).
fn slot(i: usize) -> u64 {
    BASE + i as u64 * SLOT
}

/// One direction's WRs (requester node `d`, responder node `1 - d`) and what the model expects of them.
#[derive(Default)]
struct Dir {
    plan: Vec<(Op, u32, bool, bool)>,
    wrs: Vec<(SendWr, Sge)>,
    post_at: Vec<Instant>,
    want_send: Vec<(u64, u32)>,
    want_recv: Vec<(u32, Option<u32>, bool, usize)>,
    atomic_orig: Vec<(usize, u64)>,
    counter: u64,
    recv_at: Vec<Instant>,
    posted: usize,
    recvs_posted: usize,
    got_send: Vec<roce_dp::Cqe>,
    got_recv: Vec<roce_dp::Cqe>,
    /// The requester's QP goes RTS -> SQD at the first time and back to RTS at the second.
    sqd: Option<(Instant, Instant)>,
}

/// Moves every completion into its direction: receives on node n belong to direction 1 - n.
fn drain(sim: &mut Sim, cq: [roce_dp::CqId; 2], dirs: &mut [Dir; 2]) {
    for n in 0..2 {
        while let Some(c) = sim.nodes[n].poll_cq_one(cq[n]) {
            if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                dirs[1 - n].got_recv.push(c);
            } else {
                dirs[n].got_send.push(c);
            }
        }
    }
}

fn run_model(seed: u64) {
    let mut rng = roce_dp::sim::SimRng::new(seed);
    let pick = |r: &mut roce_dp::sim::SimRng, v: &[u32]| v[r.below(v.len() as u64) as usize];
    let mtu = pick(&mut rng, &[256, 1024, 4096]);
    let loss = pick(&mut rng, &[0, 10_000, 50_000]);
    let link = LinkConfig {
        loss_ppm: loss,
        dup_ppm: pick(&mut rng, &[0, 10_000]),
        reorder_ppm: pick(&mut rng, &[0, 10_000]),
        corrupt_ppm: pick(&mut rng, &[0, 5_000]),
        ..LinkConfig::default()
    };
    let ack = match rng.below(3) {
        0 => AckPolicy::default(),
        1 => AckPolicy { max_pkts: 4, max_delay: Duration::from_micros(10) },
        _ => AckPolicy { max_pkts: 16, max_delay: Duration::from_micros(50) },
    };
    // Congestion control on (its pacer holding data frames at a 10 Gb/s line rate on the 100 Gb/s link) or off.
    let mut cc = roce_dp::cc::CcConfig::default();
    if rng.below(3) == 0 {
        cc.algorithm = roce_dp::cc::CcAlgorithm::Dcqcn;
        cc.line_rate_mbps = 10_000;
    }
    let ecfg = EngineConfig {
        ack,
        ack_req_every: pick(&mut rng, &[64, 3]),
        max_unacked_psns: pick(&mut rng, &[256, 8]),
        cc,
        ..EngineConfig::default()
    };
    let sim = Sim::new(ecfg, [link; 2], seed);
    let max_rd_atomic = [1 + rng.below(4) as u8, 1 + rng.below(4) as u8];
    let min_rnr = pick(&mut rng, &[1, 2, 4]) as u8;
    // On a clean link nothing is ever lost, so no transport retry is ever needed: retry_cnt 0 must do (RNR NAKs are
    // counted by rnr_retry alone).
    let clean = link.loss_ppm == 0 && link.dup_ppm == 0 && link.reorder_ppm == 0 && link.corrupt_ppm == 0;
    let retry_cnt = if clean { pick(&mut rng, &[0, 1, 7]) as u8 } else { 7 };
    let start_psn = [rng.below(1 << 24) as u32, M - rng.below(8) as u32];
    let c = PairCfg {
        mtu,
        psn: start_psn,
        retry_cnt,
        rnr_retry: 7,
        min_rnr_timer: min_rnr,
        timeout: 8,
        max_rd_atomic,
        region: 193 * SLOT as usize,
    };
    let Pair { mut sim, qp, cq, mr } = connect_pair(sim, c);
    let ops = [Op::Send, Op::SendImm, Op::Write, Op::WriteImm, Op::Read, Op::FetchAdd, Op::CmpSwp];
    let counter_va = slot(192);
    let mut dirs = [Dir::default(), Dir::default()];
    for (d, dir) in dirs.iter_mut().enumerate() {
        let (req, resp) = (d, 1 - d);
        dir.counter = rng.next_u64() & 0xffff;
        sim.nodes[resp].mr_bytes_mut(mr[resp].lkey).unwrap()[(counter_va - BASE) as usize..][..8]
            .copy_from_slice(&dir.counter.to_le_bytes());
        let n_wr = 10 + rng.below(50) as usize;
        let mut t = Instant::ZERO;
        for k in 0..n_wr {
            let op = ops[rng.below(ops.len() as u64) as usize];
            let len = match op {
                Op::FetchAdd | Op::CmpSwp => 8,
                _ => match rng.below(4) {
                    0 => 0,
                    1 => rng.below(64) as u32,
                    _ => rng.below(SLOT - 1000) as u32,
                },
            };
            let signaled = k + 1 == n_wr || rng.below(3) != 0;
            let fence = rng.below(5) == 0;
            dir.plan.push((op, len, signaled, fence));
            let data = fill(seed, d, k, len as usize);
            let off = (slot(k) - BASE) as usize;
            let target = slot(128 + k);
            let mut wr = match op {
                Op::Send => SendWr::new(k as u64, WrOpcode::Send),
                Op::SendImm => SendWr::new(k as u64, WrOpcode::SendWithImm),
                Op::Write => SendWr::new(k as u64, WrOpcode::RdmaWrite).remote(target, mr[resp].rkey),
                Op::WriteImm => SendWr::new(k as u64, WrOpcode::RdmaWriteWithImm).remote(target, mr[resp].rkey),
                Op::Read => SendWr::new(k as u64, WrOpcode::RdmaRead).remote(target, mr[resp].rkey),
                Op::FetchAdd => SendWr::new(k as u64, WrOpcode::AtomicFetchAdd).remote(counter_va, mr[resp].rkey),
                Op::CmpSwp => SendWr::new(k as u64, WrOpcode::AtomicCmpSwp).remote(counter_va, mr[resp].rkey),
            };
            wr.signaled = signaled;
            wr.fence = fence;
            wr.imm = 0x1000 + k as u32;
            // Small SEND/WRITE payloads sometimes inline (copied at post time).
            wr.inline =
                matches!(op, Op::Send | Op::SendImm | Op::Write | Op::WriteImm) && len <= 256 && rng.below(2) == 0;
            match op {
                Op::Send | Op::SendImm | Op::Write | Op::WriteImm => {
                    sim.nodes[req].mr_bytes_mut(mr[req].lkey).unwrap()[off..off + data.len()].copy_from_slice(&data);
                }
                Op::Read => {
                    let o = (target - BASE) as usize;
                    sim.nodes[resp].mr_bytes_mut(mr[resp].lkey).unwrap()[o..o + data.len()].copy_from_slice(&data);
                }
                Op::FetchAdd => {
                    wr.compare_add = rng.below(1000);
                    dir.atomic_orig.push((k, dir.counter));
                    dir.counter = dir.counter.wrapping_add(wr.compare_add);
                }
                Op::CmpSwp => {
                    wr.compare_add = if rng.below(2) == 0 { dir.counter } else { dir.counter ^ 1 };
                    wr.swap = rng.next_u64();
                    dir.atomic_orig.push((k, dir.counter));
                    if dir.counter == wr.compare_add {
                        dir.counter = wr.swap;
                    }
                }
            }
            if matches!(op, Op::Send | Op::SendImm | Op::WriteImm) {
                dir.want_recv.push((len, (op != Op::Send).then_some(0x1000 + k as u32), op == Op::WriteImm, k));
            }
            if signaled {
                dir.want_send.push((k as u64, if op == Op::Read { len } else { 0 }));
            }
            dir.wrs.push((wr, Sge { addr: slot(k), len, lkey: mr[req].lkey }));
            // WRs are posted over time (bursts and gaps), receives one by one with gaps of up to 300 µs.
            if rng.below(3) == 0 {
                t += Duration::from_micros(rng.below(200));
            }
            dir.post_at.push(t);
        }
        if rng.below(3) == 0 {
            let from = Instant::ZERO + Duration::from_micros(rng.below(500));
            dir.sqd = Some((from, from + Duration::from_micros(rng.below(500))));
        }
        let mut t = Instant::ZERO;
        for _ in 0..dir.want_recv.len() {
            t += Duration::from_micros(rng.below(300));
            dir.recv_at.push(t);
        }
    }
    let limit = Instant::ZERO + Duration::from_millis(20_000);
    let done = |dirs: &[Dir; 2]| {
        dirs.iter().all(|d| d.got_send.len() == d.want_send.len() && d.got_recv.len() == d.want_recv.len())
    };
    loop {
        for (d, dir) in dirs.iter_mut().enumerate() {
            if let Some((from, to)) = dir.sqd {
                let st = sim.nodes[d].query_qp(qp[d]).unwrap().state;
                let want = if sim.now >= from && sim.now < to { QpState::Sqd } else { QpState::Rts };
                if st != want && st != QpState::Err {
                    sim.nodes[d].modify_qp(qp[d], &QpAttr { state: Some(want), ..QpAttr::default() }).unwrap();
                    sim.kick(d);
                }
                if sim.now >= to {
                    dir.sqd = None;
                }
            }
            while dir.posted < dir.post_at.len() && dir.post_at[dir.posted] <= sim.now {
                let (wr, sge) = dir.wrs[dir.posted];
                sim.nodes[d].post_send(qp[d], &wr, &[sge]).unwrap();
                sim.kick(d);
                dir.posted += 1;
            }
            let resp = 1 - d;
            while dir.recvs_posted < dir.recv_at.len() && dir.recv_at[dir.recvs_posted] <= sim.now {
                let j = dir.recvs_posted;
                let s = Sge { addr: slot(64 + j), len: SLOT as u32, lkey: mr[resp].lkey };
                sim.nodes[resp].post_recv(qp[resp], 1000 + j as u64, &[s]).unwrap();
                sim.kick(resp);
                dir.recvs_posted += 1;
            }
        }
        drain(&mut sim, cq, &mut dirs);
        if done(&dirs) || sim.now > limit {
            break;
        }
        let more = sim.step();
        if !more {
            // Nothing in flight and no timer: the next post, if any, is the next event.
            let next = dirs
                .iter()
                .flat_map(|d| {
                    let sqd = d.sqd.into_iter().flat_map(|(a, b)| [a, b]).filter(|&t| t > sim.now);
                    d.post_at
                        .get(d.posted)
                        .copied()
                        .into_iter()
                        .chain(d.recv_at.get(d.recvs_posted).copied())
                        .chain(sqd)
                })
                .min();
            match next {
                Some(t) => sim.now = sim.now.max(t),
                None => {
                    drain(&mut sim, cq, &mut dirs);
                    break;
                }
            }
        }
    }
    let m = [sim.nodes[0].mr_bytes(mr[0].lkey).unwrap().to_vec(), sim.nodes[1].mr_bytes(mr[1].lkey).unwrap().to_vec()];
    for (d, dir) in dirs.iter().enumerate() {
        let (req, resp) = (d, 1 - d);
        let ctx = format!(
            "direction {d}, seed {seed} (ROCE_SIM_SEED={seed}): {ecfg:?} {link:?} retry_cnt {retry_cnt} mtu {mtu} max_rd_atomic \
             {max_rd_atomic:?} psns {start_psn:?} plan {:?} at {:?}; requester {:?} {:?}; responder {:?} {:?}; \
             deadlines {:?} {:?}",
            dir.plan,
            sim.now,
            sim.nodes[req].query_qp(qp[req]).unwrap(),
            sim.nodes[req].qp_counters(qp[req]).unwrap(),
            sim.nodes[resp].query_qp(qp[resp]).unwrap(),
            sim.nodes[resp].qp_counters(qp[resp]).unwrap(),
            sim.nodes[0].poll_timeout(),
            sim.nodes[1].poll_timeout(),
        );
        let send: Vec<(u64, WcStatus, u32)> = dir.got_send.iter().map(|c| (c.wr_id, c.status, c.byte_len)).collect();
        let want: Vec<(u64, WcStatus, u32)> = dir.want_send.iter().map(|&(k, l)| (k, WcStatus::Success, l)).collect();
        assert_eq!(send, want, "send completions, {ctx}");
        let recv: Vec<(u64, WcStatus, u32, Option<u32>, WcOpcode)> =
            dir.got_recv.iter().map(|c| (c.wr_id, c.status, c.byte_len, c.imm, c.opcode)).collect();
        let wantr: Vec<(u64, WcStatus, u32, Option<u32>, WcOpcode)> = dir
            .want_recv
            .iter()
            .enumerate()
            .map(|(j, &(l, imm, wimm, _))| {
                let op = if wimm { WcOpcode::RecvRdmaWithImm } else { WcOpcode::Recv };
                (1000 + j as u64, WcStatus::Success, l, imm, op)
            })
            .collect();
        assert_eq!(recv, wantr, "receive completions, {ctx}");
        for (k, &(op, len, _, _)) in dir.plan.iter().enumerate() {
            let data = fill(seed, d, k, len as usize);
            let local = (slot(k) - BASE) as usize;
            let target = (slot(128 + k) - BASE) as usize;
            match op {
                Op::Write | Op::WriteImm => {
                    assert_eq!(&m[resp][target..target + data.len()], &data[..], "WRITE {k}, {ctx}")
                }
                Op::Read => assert_eq!(&m[req][local..local + data.len()], &data[..], "READ {k}, {ctx}"),
                _ => {}
            }
        }
        for (j, &(len, _, wimm, k)) in dir.want_recv.iter().enumerate() {
            if !wimm {
                let off = (slot(64 + j) - BASE) as usize;
                assert_eq!(&m[resp][off..off + len as usize], &fill(seed, d, k, len as usize)[..], "SEND {k}, {ctx}");
            }
        }
        for &(k, orig) in &dir.atomic_orig {
            let off = (slot(k) - BASE) as usize;
            assert_eq!(u64::from_le_bytes(m[req][off..off + 8].try_into().unwrap()), orig, "atomic {k}, {ctx}");
        }
        let c = (counter_va - BASE) as usize;
        assert_eq!(u64::from_le_bytes(m[resp][c..c + 8].try_into().unwrap()), dir.counter, "counter, {ctx}");
        assert_eq!(sim.nodes[req].query_qp(qp[req]).unwrap().state, QpState::Rts, "{ctx}");
    }
}

#[test]
fn random_wr_mixes_both_ways_between_two_engines_match_the_verbs_model() {
    if let Some(s) = std::env::var("ROCE_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        run_model(s);
        return;
    }
    let n = std::env::var("ROCE_AUDIT_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40u64);
    for seed in 1..=n {
        run_model(seed);
    }
}

// ============================================================================ duplicates of a request the network copied
//
// A duplicate READ is re-executed and a duplicate atomic replayed (ROCE-NOTES §1.6); a request the network
// duplicated (not a requester's go-back-N) arrives while the responses of later requests, executed already, wait
// in the queue. They are the requester's only copy: nothing will ask for them again before its local ACK timeout.

#[test]
fn a_network_copy_of_a_read_request_does_not_discard_the_later_responses_queued() {
    let mut p = Peer::new();
    p.fill_data();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 2048)); // R, R+1
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R + 2).ack_req().atomic(DATA_VA + 0x3000, k, 1, 0));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 3).ack_req().reth(DATA_VA + 0x2000, k, 16));
    // The copy of the first request, before anything left.
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 2048));
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, R),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, R + 1),
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, R + 2),
            (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R + 3)
        ],
        "{}",
        show(&v)
    );
    assert_eq!((v[1].aeth().msn, v[2].aeth().msn, v[3].aeth().msn), (1, 2, 3));
    assert_eq!(&v[3].payload[..], &p.data()[0x2000..0x2010]);
    // The same when the first READ's responses had all left: the copy answers it again, then the rest follows.
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 16));
    assert_eq!(ops(&p.tx()), vec![(Opcode::RC_RDMA_READ_RESPONSE_ONLY, R)]);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA, k, 2048));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 16));
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![
            (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R),
            (Opcode::RC_RDMA_READ_RESPONSE_FIRST, R + 1),
            (Opcode::RC_RDMA_READ_RESPONSE_LAST, R + 2)
        ],
        "{}",
        show(&v)
    );
    // A copy of an atomic: its saved result again, the later READ's responses still follow.
    let mut p = Peer::new();
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 5, 0));
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R + 1).ack_req().reth(DATA_VA, k, 16));
    p.rx(Pkt::new(Opcode::RC_FETCH_ADD, R).ack_req().atomic(DATA_VA, k, 5, 0));
    let v = p.tx();
    assert_eq!(
        ops(&v),
        vec![(Opcode::RC_ATOMIC_ACKNOWLEDGE, R), (Opcode::RC_RDMA_READ_RESPONSE_ONLY, R + 1)],
        "{}",
        show(&v)
    );
}

#[test]
fn a_duplicated_read_request_costs_the_requester_no_timeout_between_two_engines() {
    // Two engines, a clean link; node 1's responder gets READ 1, READ 2 and then a copy of READ 1's request (what a
    // duplicating switch does). Both READs must complete well before the local ACK timeout (2^12 * 4.096 µs).
    let mut pr = pair(1024, 7, 7, 1);
    pr.sim.nodes[1].mr_bytes_mut(pr.mr[1].lkey).unwrap()[..4096].fill(0x3c);
    for (id, off) in [(1u64, 0u64), (2, 2048)] {
        let wr = SendWr::new(id, WrOpcode::RdmaRead).remote(BASE + off, pr.mr[1].rkey);
        let s = Sge { addr: BASE + 0x10000 + off, len: 2048, lkey: pr.mr[0].lkey };
        pr.sim.nodes[0].post_send(pr.qp[0], &wr, &[s]).unwrap();
    }
    // Take node 0's two READ requests by hand and hand node 1 the first one twice.
    let mut buf = vec![0u8; BUF_LEN];
    let mut reqs = Vec::new();
    while let Some(n) = pr.sim.nodes[0].poll_transmit(Instant::ZERO, &mut buf) {
        reqs.push(buf[..n].to_vec());
    }
    assert_eq!(reqs.len(), 2);
    for f in [&reqs[0], &reqs[1], &reqs[0]] {
        pr.sim.nodes[1].handle_rx(Instant::ZERO, f, roce_dp::RxMeta::default());
    }
    let mut resps = Vec::new();
    while let Some(n) = pr.sim.nodes[1].poll_transmit(Instant::ZERO, &mut buf) {
        resps.push(buf[..n].to_vec());
    }
    for f in &resps {
        pr.sim.nodes[0].handle_rx(Instant::ZERO, f, roce_dp::RxMeta::default());
    }
    let c = pr.cqes(0);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)],
        "READ 2's responses must not wait for a timeout"
    );
}

// ============================================================================ the window and the AckReq interval
//
// ROCE-NOTES §1.4/§1.5: the requester stops at a window of unacknowledged PSNs, and only AckReq'd packets are
// acknowledged. A window smaller than the AckReq interval must still ask for an ACK before it closes, or the
// requester waits for the local ACK timeout (and with retry_cnt 0 fails) on every window of a long message.

#[test]
fn a_window_smaller_than_the_ack_request_interval_still_asks_for_an_ack_before_it_closes() {
    let mut p = Peer::with(PeerCfg { max_unacked_psns: 8, ack_req_every: 64, retry_cnt: 0, ..PeerCfg::default() });
    p.post_write(1, 0, 20 * 1024, RVA, RKEY);
    let mut sent = 0u32;
    while sent < 20 {
        let v = p.tx();
        assert!(!v.is_empty(), "the requester stalled after {sent} packets: {}", show(&v));
        let last_req = v.iter().rev().find(|o| o.repr.bth.ack_req).map(|o| o.psn());
        let Some(a) = last_req else { panic!("a window closed without an ACK request: {}", show(&v)) };
        sent += v.len() as u32;
        // The responder ACKs the AckReq'd packet (everything up to it arrived).
        p.rx(ack(a, 0));
    }
    p.expect_cqes(&[(1, WcStatus::Success)]);
    assert_eq!(p.counters().retry_timeouts, 0);
}

#[test]
fn send_with_invalidate_of_a_key_never_registered_is_an_invalid_request() {
    let mut p = Peer::new();
    p.post_recv(1, 0, 64);
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY_WITH_INVALIDATE, R).ack_req().ieth(0x00de_ad01).fill(0, 8));
    p.expect_nak(R, NakCode::InvalidRequest);
    assert_eq!(p.state(), QpState::Err);
    assert!(p.eng.mr_bytes(p.data.lkey).is_some(), "no other region touched");
}

#[test]
fn payload_lengths_that_do_not_fit_the_opcode_are_length_errors() {
    // C9-92/C9-94 (ROCE-NOTES §1.6): MIDDLE exactly one MTU, so 1023 bytes (pad 1) is a length error; a LAST of 0
    // bytes is one too.
    let mut p = Peer::new();
    p.post_recv(1, 0, 4096);
    p.rx(Pkt::new(Opcode::RC_SEND_FIRST, R).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_SEND_MIDDLE, R + 1).fill(1024, 1023));
    p.expect_nak(R + 1, NakCode::InvalidRequest);
    let mut p = Peer::new();
    let k = p.data.rkey;
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_FIRST, R).reth(DATA_VA, k, 1024).fill(0, 1024));
    p.rx(Pkt::new(Opcode::RC_RDMA_WRITE_LAST, R + 1).ack_req());
    p.expect_nak(R + 1, NakCode::InvalidRequest);
    // A pad count larger than the payload (pad 3 on an empty SEND, ICRC recomputed) is a malformed frame:
    // dropped and counted before the transport, no NAK, no PSN consumed.
    let mut p = Peer::new();
    p.post_recv(1, 0, 64);
    let mut f = p.frame(&Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req());
    f[14 + 20 + 8 + 1] |= 0x30; // BTH byte 1, bits 5:4: the pad count
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    wire::icrc::fill(&mut f[14..14 + total]).unwrap();
    p.rx_raw(&f);
    assert_eq!(p.eng.stats().rx_drop_bad_pad, 1);
    p.tx_nothing();
    p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req());
    p.expect_ack(R, ACK, 1);
}

#[test]
fn rts_cannot_be_moved_to_sqe_by_the_application() {
    let mut p = Peer::new();
    let e = p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Sqe), ..QpAttr::default() }).unwrap_err();
    assert_eq!(e, VerbsError::BadTransition { from: QpState::Rts, to: QpState::Sqe });
    assert_eq!(p.state(), QpState::Rts);
}

#[test]
fn max_dest_rd_atomic_is_refused_where_it_would_not_take_effect() {
    // The responder's resource ring is sized on the way into RTR (ib_modify_qp_is_ok: max_dest_rd_atomic belongs
    // to INIT -> RTR). Given again in RTS (e.g. 0, "refuse READs from now on") it used to be accepted and ignored:
    // READs were still executed. It is refused with a clear error instead, and the QP keeps working.
    let mut p = Peer::new();
    let k = p.data.rkey;
    let e = p
        .eng
        .modify_qp(p.qpn, &QpAttr { state: Some(QpState::Rts), max_dest_rd_atomic: Some(0), ..QpAttr::default() })
        .unwrap_err();
    assert_eq!(e, VerbsError::AttrNotModifiable { attr: "max_dest_rd_atomic", from: QpState::Rts, to: QpState::Rts });
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 8));
    assert_eq!(p.tx_one().op(), Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    // RTR -> RTR (still on the way up) takes it, and it takes effect: 0 refuses READs.
    let mut p = Peer::new();
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    p.eng
        .modify_qp(p.qpn, &QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() })
        .unwrap();
    let rtr = p.rtr_attr();
    p.eng.modify_qp(p.qpn, &rtr).unwrap();
    p.eng.modify_qp(p.qpn, &QpAttr { max_dest_rd_atomic: Some(0), ..rtr }).unwrap();
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_REQUEST, R).ack_req().reth(DATA_VA, k, 8));
    p.expect_nak(R, NakCode::InvalidRequest);
}
