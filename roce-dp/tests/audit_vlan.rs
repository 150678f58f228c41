//! Session-10 audit: an 802.1Q-tagged RoCE frame on the engine's untagged port. A tag with a VLAN ID (1..=4094)
//! puts the frame on another network (IEEE 802.1Q): roce-dp's ports have no VLAN and every QP sends untagged, so
//! such a frame is no QP's peer speaking, and the engine must drop and count it (`rx_drop_vlan`) before it reaches
//! a QP, as the neighbour code already ignores tagged ARP/ND (tests/audit_neigh.rs). A priority tag (VID 0: an
//! 802.1p priority and no VLAN, what PFC-configured RoCE NICs send) belongs to the untagged network and is taken.
//! The old engine took a tagged SEND, WRITE or READ response as if it came untagged.

mod harness;

use harness::*;
use roce_dp::wire::{emit_frame, parse_frame, AethRepr, Opcode, VlanTag};
use roce_dp::{QpState, WcStatus};

/// The responder's first expected PSN (PeerCfg::default().rq_psn).
const R: u32 = 0x20_0000;
/// The requester's first PSN (PeerCfg::default().sq_psn).
const S: u32 = 0x10_0000;
const RVA: u64 = 0x7f00_0000_1000;
const RKEY: u32 = 0x1234;

/// The scripted frame re-emitted with an 802.1Q tag (the ICRC covers IP onwards, so it stays valid).
fn tagged(p: &Peer, pkt: &Pkt, vid: u16) -> Vec<u8> {
    let good = p.frame(pkt);
    let mut f = parse_frame(&good).unwrap();
    f.repr.eth.vlan = Some(VlanTag { pcp: 3, dei: false, vid });
    let mut buf = vec![0u8; good.len() + 4];
    let n = emit_frame(&mut buf, &f.repr, f.payload.len(), |d| d.copy_from_slice(f.payload)).unwrap();
    assert_eq!(n, good.len() + 4);
    assert!(parse_frame(&buf[..n]).unwrap().icrc_ok);
    buf.truncate(n);
    buf
}

#[test]
fn requests_tagged_for_a_vlan_are_dropped_and_counted() {
    for vid in [1, 42, 4094] {
        let mut p = Peer::new();
        p.post_recv(1, 0, 64);
        let send = tagged(&p, &Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 16), vid);
        p.rx_raw(&send);
        let write = tagged(
            &p,
            &Pkt::new(Opcode::RC_RDMA_WRITE_ONLY, R).ack_req().reth(DATA_VA + 0x100, p.data.rkey, 8).fill(0, 8),
            vid,
        );
        p.rx_raw(&write);
        p.no_cqes();
        p.tx_nothing();
        assert!(p.data().iter().all(|&b| b == 0), "VID {vid}: a tagged request wrote memory");
        assert_eq!(p.eng.stats().rx_drop_vlan, 2, "VID {vid}");
        assert_eq!(p.state(), QpState::Rts);
        // The same SEND untagged is taken: the receive WQE was left for it.
        p.rx(Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 16));
        let c = p.cqes();
        assert_eq!(c.len(), 1, "{c:?}");
        assert_recv(&c[0], 1, 16);
        p.expect_ack(R, AethRepr::ACK_UNLIMITED, 1);
    }
}

#[test]
fn a_tagged_response_does_not_complete_a_request() {
    let mut p = Peer::new();
    p.post_read(1, 0x1000, 64, RVA, RKEY);
    p.tx_one();
    let resp =
        tagged(&p, &Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 64), 7);
    p.rx_raw(&resp);
    p.no_cqes();
    assert!(p.data()[0x1000..0x1040].iter().all(|&b| b == 0), "a tagged READ response was placed");
    assert_eq!(p.eng.stats().rx_drop_vlan, 1);
    p.rx(Pkt::new(Opcode::RC_RDMA_READ_RESPONSE_ONLY, S).aeth(AethRepr::ACK_UNLIMITED, 1).fill(0, 64));
    p.expect_cqes(&[(1, WcStatus::Success)]);
}

#[test]
fn a_priority_tagged_frame_is_the_untagged_networks() {
    // VID 0: priority only (IEEE 802.1Q), sent by RoCE NICs configured for PFC without a VLAN.
    let mut p = Peer::new();
    p.post_recv(1, 0, 64);
    let send = tagged(&p, &Pkt::new(Opcode::RC_SEND_ONLY, R).ack_req().fill(0, 16), 0);
    p.rx_raw(&send);
    let c = p.cqes();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_recv(&c[0], 1, 16);
    p.expect_ack(R, AethRepr::ACK_UNLIMITED, 1);
    assert_eq!(p.eng.stats().rx_drop_vlan, 0);
}
