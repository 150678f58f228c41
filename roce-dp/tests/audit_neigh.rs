//! Session 9's audit of the non-RoCE frame handling a soft NIC needs without a kernel (`roce_dp::neigh`, which
//! the DPDK worker calls for every frame; no DPDK needed): ARP and IPv6 neighbour discovery against spoofing,
//! storms, truncation and VLAN tags, and the frame classifier that steers RoCE frames by BTH destination QP.
//!
//! Expected behaviour from the RFCs and what Linux does: RFC 826 (answer requests for our address; merge the
//! sender into an existing entry, add it only when the request was for us), RFC 5227 (an ARP probe's sender
//! address 0.0.0.0 is there so that no cache learns from it), RFC 4861 (§7.1.1 validation: hop limit 255, code 0,
//! checksum, no source link-layer option from the unspecified address; §7.2.3: an NS whose target is not ours is
//! silently discarded; §7.2.4: a DAD NS for our address is answered to all-nodes with S clear). The port has no
//! VLAN configured and answers untagged, so a tagged ARP or ND frame is not for it (Linux drops frames of a VLAN
//! it has no interface for).

use roce_dp::neigh::{classify, FrameKind, NeighIp, Neighbours};
use roce_dp::wire::MacAddr;

const OUR_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const OUR_V4: [u8; 4] = [10, 0, 0, 1];
const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const PEER_V4: [u8; 4] = [10, 0, 0, 2];

fn v6(last: u8) -> [u8; 16] {
    [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last]
}

fn ours() -> Neighbours {
    Neighbours::new(OUR_MAC, Some(OUR_V4), Some(v6(1)))
}

/// An ARP frame (oper 1 request, 2 reply) as a peer sends it.
fn arp(oper: u16, sha: MacAddr, spa: [u8; 4], tha: MacAddr, tpa: [u8; 4], dst: MacAddr) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&sha.0);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4]);
    f.extend_from_slice(&oper.to_be_bytes());
    f.extend_from_slice(&sha.0);
    f.extend_from_slice(&spa);
    f.extend_from_slice(&tha.0);
    f.extend_from_slice(&tpa);
    f.resize(60, 0);
    f
}

/// RFC 4443 checksum over the IPv6 pseudo-header and the ICMPv6 message.
fn icmp6_sum(src: &[u8; 16], dst: &[u8; 16], msg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    };
    add(src);
    add(dst);
    add(&(msg.len() as u32).to_be_bytes());
    add(&[0, 0, 0, 58]);
    add(msg);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A neighbour solicitation from (`mac`, `src`) for `target`, with a source link-layer address option if `sllao`,
/// to the target's solicited-node multicast address.
fn ns(mac: MacAddr, src: [u8; 16], target: [u8; 16], sllao: bool, hop_limit: u8) -> Vec<u8> {
    let mut dst = [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0];
    dst[13..].copy_from_slice(&target[13..]);
    let mut icmp = vec![135, 0, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&target);
    if sllao {
        icmp.extend_from_slice(&[1, 1]);
        icmp.extend_from_slice(&mac.0);
    }
    let sum = icmp6_sum(&src, &dst, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut f = vec![0x33, 0x33, 0xff, target[13], target[14], target[15]];
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.extend_from_slice(&[58, hop_limit]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&icmp);
    f
}

/// `f` with an 802.1Q tag (VLAN `vid`) after the MAC addresses.
fn tagged(f: &[u8], vid: u16) -> Vec<u8> {
    let mut t = f[..12].to_vec();
    t.extend_from_slice(&[0x81, 0x00]);
    t.extend_from_slice(&vid.to_be_bytes());
    t.extend_from_slice(&f[12..]);
    t
}

fn handle(n: &mut Neighbours, f: &[u8]) -> Option<Vec<u8>> {
    let mut out = [0u8; 128];
    n.handle(f, &mut out).map(|len| out[..len].to_vec())
}

/// RFC 4861 §7.2.3: an NS whose target is not one of ours is silently discarded: no answer and nothing learned
/// from it (as an ARP request for another host: RFC 826 adds the sender only when the request is for us).
#[test]
fn a_solicitation_for_another_target_is_discarded_and_teaches_nothing() {
    let mut n = ours();
    let f = ns(PEER_MAC, v6(2), v6(3), true, 255);
    assert_eq!(handle(&mut n, &f), None);
    assert_eq!(n.lookup(NeighIp::V6(v6(2))), None, "learned from an NS for someone else");
    assert_eq!((n.stats.nd_rx, n.stats.ignored, n.stats.learned), (1, 1, 0));
    // A storm of them from 10000 sources leaves a static entry and a learned one alone.
    n.add_static(NeighIp::V6(v6(9)), MacAddr([2, 9, 9, 9, 9, 9]));
    assert!(handle(&mut n, &ns(PEER_MAC, v6(2), v6(1), true, 255)).is_some(), "an NS for us is answered");
    for i in 0..10_000u32 {
        let mut src = v6(0);
        src[12..].copy_from_slice(&(i + 0x100).to_be_bytes());
        let mac = MacAddr([2, 0xee, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8]);
        assert_eq!(handle(&mut n, &ns(mac, src, v6(3), true, 255)), None);
    }
    assert_eq!(n.lookup(NeighIp::V6(v6(9))), Some(MacAddr([2, 9, 9, 9, 9, 9])));
    assert_eq!(n.lookup(NeighIp::V6(v6(2))), Some(PEER_MAC));
}

/// The port has no VLAN and its answers carry no tag: a tagged ARP request or NS for our address gets no
/// (untagged) answer and teaches nothing; both count as ignored.
#[test]
fn tagged_arp_and_nd_frames_are_not_answered_untagged() {
    let mut n = ours();
    let req = arp(1, PEER_MAC, PEER_V4, MacAddr::default(), OUR_V4, MacAddr([0xff; 6]));
    assert!(handle(&mut n.clone(), &req).is_some(), "the untagged request is answered");
    assert_eq!(handle(&mut n, &tagged(&req, 5)), None);
    let sol = ns(PEER_MAC, v6(2), v6(1), true, 255);
    assert!(handle(&mut n.clone(), &sol).is_some(), "the untagged NS is answered");
    assert_eq!(handle(&mut n, &tagged(&sol, 5)), None, "a tagged NS answered untagged");
    assert_eq!(n.lookup(NeighIp::V4(PEER_V4)), None);
    assert_eq!(n.lookup(NeighIp::V6(v6(2))), None);
    assert_eq!((n.stats.arp_rx, n.stats.nd_rx, n.stats.ignored), (1, 1, 2));
    assert_eq!((n.stats.arp_replies, n.stats.nd_adverts), (0, 0));
}

/// IEEE 802.1Q: a priority tag (VID 0, only the PCP set, as hosts with PFC for RoCE send) is the untagged network's
/// (Linux takes it as untagged; so does the engine for RoCE frames): an ARP request or NS for our address in one is
/// answered as the untagged one is (the same bytes, untagged) and teaches its sender. A VLAN tag with the same PCP
/// (VID 5) still gets nothing.
#[test]
fn priority_tagged_arp_and_nd_frames_are_the_untagged_networks() {
    let req = arp(1, PEER_MAC, PEER_V4, MacAddr::default(), OUR_V4, MacAddr([0xff; 6]));
    let sol = ns(PEER_MAC, v6(2), v6(1), true, 255);
    for pcp in [0u16, 3 << 13, 7 << 13] {
        let mut n = ours();
        let plain = handle(&mut ours(), &req).expect("the untagged request is answered");
        assert_eq!(handle(&mut n, &tagged(&req, pcp)).as_deref(), Some(&plain[..]), "PCP {}", pcp >> 13);
        assert_eq!(n.lookup(NeighIp::V4(PEER_V4)), Some(PEER_MAC));
        let plain = handle(&mut ours(), &sol).expect("the untagged NS is answered");
        assert_eq!(handle(&mut n, &tagged(&sol, pcp)).as_deref(), Some(&plain[..]), "PCP {}", pcp >> 13);
        assert_eq!(n.lookup(NeighIp::V6(v6(2))), Some(PEER_MAC));
        assert_eq!((n.stats.arp_replies, n.stats.nd_adverts, n.stats.ignored), (1, 1, 0));
        let mut n = ours();
        assert_eq!(handle(&mut n, &tagged(&req, pcp | 5)), None, "VLAN 5");
        assert_eq!(handle(&mut n, &tagged(&sol, pcp | 5)), None, "VLAN 5");
        assert_eq!((n.stats.learned, n.stats.ignored), (0, 2));
    }
    // Cut anywhere, a priority-tagged request never panics, and is answered only while its 28-byte ARP packet
    // (RFC 826, after the 14-byte header and the 4-byte tag) is whole: the padding to 60 bytes is not needed.
    let t = tagged(&req, 0);
    for len in 0..t.len() {
        assert_eq!(handle(&mut ours(), &t[..len]).is_some(), len >= 18 + 28, "cut at {len}");
    }
}

/// RFC 5227: an ARP probe (sender address 0.0.0.0) for our address is answered (that is how the prober learns of
/// the conflict) but no entry is made for 0.0.0.0, which is what the zero sender address is for.
#[test]
fn an_arp_probe_for_our_address_is_answered_and_not_learned() {
    let mut n = ours();
    let probe = arp(1, PEER_MAC, [0; 4], MacAddr::default(), OUR_V4, MacAddr([0xff; 6]));
    let r = handle(&mut n, &probe).expect("the probe is answered");
    assert_eq!(&r[0..6], &PEER_MAC.0, "to the prober");
    assert_eq!(&r[20..22], &[0, 2], "an ARP reply");
    assert_eq!((&r[22..28], &r[28..32]), (&OUR_MAC.0[..], &OUR_V4[..]), "saying who has our address");
    assert_eq!(n.lookup(NeighIp::V4([0; 4])), None, "0.0.0.0 learned from a probe");
    assert_eq!(n.stats.learned, 0);
}

/// RFC 4861 §7.2.4: a duplicate address detection NS (from the unspecified address, no link-layer option) for our
/// address is answered, to the all-nodes address with the Solicited flag clear and Override set; an NS from the
/// unspecified address that carries a source link-layer option is invalid (§7.1.1) and dropped.
#[test]
fn a_dad_solicitation_for_our_address_is_answered_to_all_nodes() {
    let mut n = ours();
    let dad = ns(PEER_MAC, [0; 16], v6(1), false, 255);
    let r = handle(&mut n, &dad).expect("a DAD NS for our address is answered");
    assert_eq!(&r[0..6], &[0x33, 0x33, 0, 0, 0, 1], "all-nodes multicast MAC");
    assert_eq!(&r[6..12], &OUR_MAC.0);
    let (ip, icmp) = (&r[14..54], &r[54..]);
    assert_eq!(ip[7], 255, "hop limit");
    assert_eq!(&ip[8..24], &v6(1), "from our address");
    assert_eq!(&ip[24..40], &[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], "to ff02::1");
    assert_eq!(icmp[0], 136, "an NA");
    assert_eq!(icmp[4] & 0xe0, 0x20, "Solicited clear, Override set");
    assert_eq!(&icmp[8..24], &v6(1), "target");
    let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let (src, dst): ([u8; 16], [u8; 16]) = (ip[8..24].try_into().unwrap(), ip[24..40].try_into().unwrap());
    assert_eq!(icmp6_sum(&src, &dst, &icmp[..plen]), 0, "checksum");
    assert_eq!(n.stats.learned, 0);
    let bad = ns(PEER_MAC, [0; 16], v6(1), true, 255);
    assert_eq!(handle(&mut n, &bad), None, "SLLAO from the unspecified address");
    assert_eq!(n.lookup(NeighIp::V6([0; 16])), None);
}

/// RFC 826's merge: a gratuitous ARP (sender = target = the peer) updates the peer's learned entry (a peer that
/// moved to another NIC; Linux does the same for an existing entry), never a static one, and teaches nothing about
/// hosts we have no entry for.
#[test]
fn gratuitous_arp_updates_a_learned_peer_but_not_a_static_one_or_a_stranger() {
    let mut n = ours();
    let req = arp(1, PEER_MAC, PEER_V4, MacAddr::default(), OUR_V4, MacAddr([0xff; 6]));
    assert!(handle(&mut n, &req).is_some());
    assert_eq!(n.lookup(NeighIp::V4(PEER_V4)), Some(PEER_MAC));
    let moved = MacAddr([2, 0, 0, 0, 0, 0x22]);
    let garp = arp(1, moved, PEER_V4, MacAddr::default(), PEER_V4, MacAddr([0xff; 6]));
    assert_eq!(handle(&mut n, &garp), None, "not a request for us");
    assert_eq!(n.lookup(NeighIp::V4(PEER_V4)), Some(moved));
    let stat = MacAddr([2, 5, 5, 5, 5, 5]);
    n.add_static(NeighIp::V4([10, 0, 0, 5]), stat);
    assert_eq!(
        handle(&mut n, &arp(1, moved, [10, 0, 0, 5], MacAddr::default(), [10, 0, 0, 5], MacAddr([0xff; 6]))),
        None
    );
    assert_eq!(n.lookup(NeighIp::V4([10, 0, 0, 5])), Some(stat));
    assert_eq!(
        handle(&mut n, &arp(1, moved, [10, 0, 0, 7], MacAddr::default(), [10, 0, 0, 7], MacAddr([0xff; 6]))),
        None
    );
    assert_eq!(n.lookup(NeighIp::V4([10, 0, 0, 7])), None, "a stranger's gratuitous ARP");
}

/// Every truncation of a valid ARP request and NS for us: an answer only when the whole message is there (ARP's 28
/// bytes; the NS's payload length), never a panic; a hop limit other than 255 or a bad checksum: no answer.
#[test]
fn truncated_and_invalid_arp_and_nd_frames_get_no_answer() {
    let req = arp(1, PEER_MAC, PEER_V4, MacAddr::default(), OUR_V4, MacAddr([0xff; 6]));
    for len in 0..=req.len() {
        let r = handle(&mut ours(), &req[..len]);
        assert_eq!(r.is_some(), len >= 42, "ARP cut to {len} bytes");
    }
    let sol = ns(PEER_MAC, v6(2), v6(1), true, 255);
    for len in 0..=sol.len() {
        let r = handle(&mut ours(), &sol[..len]);
        assert_eq!(r.is_some(), len == sol.len(), "NS cut to {len} bytes");
    }
    assert_eq!(handle(&mut ours(), &ns(PEER_MAC, v6(2), v6(1), true, 254)), None, "hop limit 254");
    let mut bad = sol.clone();
    *bad.last_mut().unwrap() ^= 1;
    assert_eq!(handle(&mut ours(), &bad), None, "bad checksum");
    // Random bytes under both ethertypes: never a panic.
    let mut rng = roce_dp::sim::SimRng::new(0x2545_f491);
    let mut n = ours();
    for i in 0..20_000 {
        let len = (i % 120) as usize;
        let mut f: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if len >= 14 {
            f[12..14].copy_from_slice(if i % 2 == 0 { &[0x08, 0x06] } else { &[0x86, 0xdd] });
        }
        if len > 20 && i % 4 == 1 {
            f[20] = 58;
            f[54.min(len - 1)] = 135;
        }
        let _ = handle(&mut n, &f);
    }
}

/// The classifier steers by BTH destination QP for tagged and untagged frames alike and never reads past a
/// truncated frame (a cut BTH gives QP 0, which no worker owns).
#[test]
fn classify_reads_the_bth_qp_tagged_or_not_and_survives_truncation() {
    let mut f = vec![0u8; 14 + 20 + 8 + 12 + 4];
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[14 + 9] = 17;
    f[34 + 2..34 + 4].copy_from_slice(&4791u16.to_be_bytes());
    f[42 + 5..42 + 8].copy_from_slice(&[0x01, 0x02, 0x03]);
    assert_eq!(classify(&f), FrameKind::Roce { dest_qp: 0x010203 });
    assert_eq!(classify(&tagged(&f, 7)), FrameKind::Roce { dest_qp: 0x010203 });
    for len in 0..f.len() {
        let k = classify(&f[..len]);
        let want = if len >= 50 {
            FrameKind::Roce { dest_qp: 0x010203 }
        } else if len >= 38 {
            FrameKind::Roce { dest_qp: 0 }
        } else {
            FrameKind::Other
        };
        assert_eq!(k, want, "cut to {len} bytes");
    }
}
