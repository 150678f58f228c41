//! Session 16 review of the receive ICRC checked in place (`wire::icrc::rx_prepare` / `rx_check` / `rx_restore`,
//! `wire::parse_rx_prepared`, `Engine::handle_rx_mut`), each against the read-only path it replaces:
//!
//! - every frame of every Linux rxe capture, IPv6 copies of their RoCE frames, and mutations of both (every cut,
//!   Ethernet padding, IP and UDP length fields that disagree with the frame, single bit flips, a VLAN tag, IPv4
//!   options, random bytes): `verify_in_place` answers what `verify` of the IP packet does for every frame of the
//!   shape it takes (None for the rest, from an independent reading of that shape), `parse_rx_prepared` of the
//!   prepared frame gives what `parse_rx` of the untouched frame does, and the frame's bytes are as before;
//! - two engines set up alike, IPv4 and IPv6, each frame to one through `handle_rx_mut` and to the other through
//!   `handle_rx`, with frame lengths on both sides of `RX_IN_PLACE_MAX` (145/146: Ethernet padding makes any
//!   length): the same counters, completions, frames sent and memory.

mod common;

use roce_dp::sim::SimRng;
use roce_dp::wire::icrc::{rx_prepare, rx_restore, verify, verify_in_place};
use roce_dp::wire::{emit_frame, parse_rx, parse_rx_prepared, IpAddrs, MacAddr, Opcode, Psn, RethRepr, RoceRepr};
use roce_dp::{
    AccessFlags, CqId, Engine, EngineConfig, Instant, LocalIp, MrKeys, PeerAddr, QpAttr, QpCaps, QpState, RxMeta,
};

/// A number below `n` from `rng`.
fn below(rng: &mut SimRng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

/// What `verify_in_place` must answer, read from the frame independently of the code under test: Ethernet II
/// without a tag; IPv4 whose first byte is 0x45 or IPv6 (version 6) under the matching EtherType; an IP length
/// field (IPv4 total length, IPv6 40 + payload length) that covers IP + UDP + BTH + ICRC and lies within the
/// frame. Then `verify` of that IP packet; None for any other frame.
fn expected(f: &[u8]) -> Option<bool> {
    let ip = f.get(14..)?;
    let (v4, ip_len) = match (f.get(12..14)?, ip.first()?) {
        ([0x08, 0x00], 0x45) => (true, usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]))),
        ([0x86, 0xdd], b) if b >> 4 == 6 => (false, 40 + usize::from(u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]))),
        _ => return None,
    };
    let min = if v4 { 20 } else { 40 } + 8 + 12 + 4;
    if ip_len < min || ip_len > ip.len() {
        return None;
    }
    Some(verify(&ip[..ip_len]) == Ok(true))
}

/// `verify_in_place` against [`expected`], `parse_rx_prepared` of the prepared frame against `parse_rx` of the
/// untouched one, the bytes restored.
fn check(f: &[u8], what: &str) -> Option<bool> {
    let mut g = f.to_vec();
    let got = verify_in_place(&mut g);
    assert!(g == f, "{what}: verify_in_place changed the frame");
    assert_eq!(got, expected(f), "{what}: {f:02x?}");
    let prep = rx_prepare(&mut g);
    assert_eq!(prep.is_some(), got.is_some(), "{what}: rx_prepare takes what verify_in_place takes");
    let prepared = format!("{:?}", parse_rx_prepared(&g, prep.as_ref()));
    if let Some(p) = prep {
        rx_restore(&mut g, p);
    }
    assert!(g == f, "{what}: rx_restore did not put the bytes back");
    assert_eq!(prepared, format!("{:?}", parse_rx(f)), "{what}: the prepared parse differs: {f:02x?}");
    got
}

/// An IPv6 copy of an untagged IPv4 RoCE frame without options: the same Ethernet addresses, UDP, BTH, payload;
/// random traffic class, flow label and hop limit (all masked); the UDP length and the ICRC made right.
fn to_ipv6(f: &[u8], rng: &mut SimRng) -> Vec<u8> {
    let l4 = &f[34..14 + usize::from(u16::from_be_bytes([f[16], f[17]]))];
    let mut g = f[..12].to_vec();
    g.extend([0x86, 0xdd]);
    let r = rng.next_u64();
    g.extend([0x60 | (r as u8 & 0x0f), (r >> 8) as u8, (r >> 16) as u8, (r >> 24) as u8]);
    g.extend((l4.len() as u16).to_be_bytes());
    g.extend([17, (r >> 32) as u8]);
    g.extend([0xfd; 15]);
    g.push(1);
    g.extend([0xfd; 15]);
    g.push(2);
    g.extend_from_slice(l4);
    let ip_end = g.len();
    roce_dp::wire::icrc::fill(&mut g[14..ip_end]).unwrap();
    g
}

/// The IP length field of `f` set to `len` (IPv4 total length or IPv6 payload length, as the EtherType says).
fn set_ip_len(f: &mut [u8], len: usize) {
    let at = if f[12..14] == [0x86, 0xdd] { 18 } else { 16 };
    f[at..at + 2].copy_from_slice(&(len as u16).to_be_bytes());
}

#[test]
fn in_place_check_and_prepared_parse_equal_the_read_only_ones_on_rxe_frames_and_mutations() {
    let mut rng = SimRng::new(0x5eed_0016);
    let mut frames: Vec<(String, Vec<u8>)> = Vec::new();
    for c in common::CAPTURES {
        for (i, (_, f)) in common::load(c.name).into_iter().enumerate() {
            frames.push((format!("{} #{i}", c.name), f));
        }
    }
    let roce: Vec<Vec<u8>> = common::all_roce_frames().into_iter().map(|(_, f)| f).collect();
    for (i, f) in roce.iter().enumerate() {
        if f[12..14] == [0x08, 0x00] && f[14] == 0x45 {
            frames.push((format!("IPv6 copy of RoCE frame #{i}"), to_ipv6(f, &mut rng)));
        }
    }
    let (mut taken, mut good, mut checked) = (0, 0, 0);
    let mut look = |f: &[u8], what: &str| {
        checked += 1;
        if let Some(ok) = check(f, what) {
            taken += 1;
            good += usize::from(ok);
        }
    };
    for (name, f) in &frames {
        look(f, name);
        if roce_dp::wire::parse_frame(f).is_err() {
            continue; // perftest's TCP: the frame itself is enough
        }
        let short = f.len() <= 200;
        // Every cut (short frames), or the cuts around the headers and the end.
        for n in 0..f.len() {
            if short || n < 100 || n + 8 > f.len() {
                look(&f[..n], &format!("{name} cut to {n}"));
            }
        }
        // Ethernet padding after the IP packet (not covered): any length, so 145 and 146 too.
        for extra in 1..=20 {
            let mut g = f.clone();
            g.extend((0..extra).map(|_| rng.next_u64() as u8));
            look(&g, &format!("{name} + {extra} B of padding"));
        }
        // IP length fields that disagree with the frame, each way (and UDP's with the IP's).
        let ip_len = if f[12..14] == [0x86, 0xdd] {
            usize::from(u16::from_be_bytes([f[18], f[19]]))
        } else {
            usize::from(u16::from_be_bytes([f[16], f[17]]))
        };
        for d in [-70i64, -45, -44, -25, -17, -5, -4, -1, 1, 3, 4, 40, 1000] {
            let mut g = f.clone();
            g.extend([0u8; 8]);
            set_ip_len(&mut g, (ip_len as i64 + d).clamp(0, 0xffff) as usize);
            look(&g, &format!("{name} IP length {d:+}"));
        }
        let udp = if f[12..14] == [0x86, 0xdd] { 54 } else { 34 };
        for d in [-4i16, -1, 1, 4] {
            let mut g = f.clone();
            let l = u16::from_be_bytes([g[udp + 4], g[udp + 5]]).wrapping_add_signed(d);
            g[udp + 4..udp + 6].copy_from_slice(&l.to_be_bytes());
            look(&g, &format!("{name} UDP length {d:+}"));
        }
        // Single bit flips: every bit of a short frame, 64 random ones of a long one.
        let flips: Vec<usize> =
            if short { (0..f.len() * 8).collect() } else { (0..64).map(|_| below(&mut rng, f.len() * 8)).collect() };
        for bit in flips {
            let mut g = f.clone();
            g[bit / 8] ^= 1 << (bit % 8);
            look(&g, &format!("{name} bit {bit} flipped"));
        }
        // A VLAN tag (802.1Q, VID 5 and the priority tag VID 0): the read-only path's.
        for tci in [[0x00, 0x05], [0xa0, 0x00]] {
            let mut g = f.clone();
            g.splice(12..12, [0x81, 0x00, tci[0], tci[1]]);
            look(&g, &format!("{name} tagged {tci:02x?}"));
        }
        // IPv4 options (IHL 6) and random bytes in the headers.
        if f[12..14] == [0x08, 0x00] {
            let mut g = f.clone();
            g.splice(34..34, [1, 1, 1, 1]);
            g[14] = 0x46;
            set_ip_len(&mut g, ip_len + 4);
            look(&g, &format!("{name} with IPv4 options"));
        }
        for _ in 0..8 {
            let mut g = f.clone();
            let at = below(&mut rng, f.len().min(80));
            g[at] = rng.next_u64() as u8;
            look(&g, &format!("{name} byte {at} random"));
        }
    }
    // Random bytes behind the Ethernet and IP type bytes of each shape.
    for _ in 0..20_000 {
        let n = below(&mut rng, 200);
        let mut g: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        if n > 15 {
            let (t, b) = [([0x08, 0x00], 0x45), ([0x86, 0xdd], 0x60)][below(&mut rng, 2)];
            g[12..14].copy_from_slice(&t);
            g[14] = b;
        }
        look(&g, "random");
    }
    assert!(checked > 200_000 && taken > 100_000 && good > 5_000, "checked {checked}, taken {taken}, good {good}");
}

// ------------------------------------------------------------------------------------------------ the engines

const LOCAL_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const REMOTE_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const REMOTE_QPN: u32 = 0x77;
const R: u32 = 0x20_0000;

/// One engine with an RC QP in RTS whose peer is at `peer` (IPv4 or IPv6), an MR of every right at 0 and 64 receives.
struct Side {
    eng: Engine,
    qpn: u32,
    cq: CqId,
    mr: MrKeys,
    addrs: IpAddrs,
}

impl Side {
    fn new(v6: bool) -> Side {
        let (l6, r6) = ([0xfd; 16], { std::array::from_fn(|i| if i == 15 { 2 } else { 0xfd }) });
        let (local_ip, peer) = if v6 {
            (LocalIp { v4: None, v6: Some(l6) }, IpAddrs::V6 { src: l6, dst: r6 })
        } else {
            (LocalIp { v4: Some([10, 0, 0, 1]), v6: None }, IpAddrs::V4 { src: [10, 0, 0, 1], dst: [10, 0, 0, 2] })
        };
        let mut eng =
            Engine::new(EngineConfig { local_mac: LOCAL_MAC, local_ip, qpn_base: 0x11, ..EngineConfig::default() });
        let pd = eng.alloc_pd();
        let mr = eng.reg_mr(pd, 0, 4096, AccessFlags::ALL).unwrap();
        let cq = eng.create_cq(4096).unwrap();
        let qpn = eng.create_qp(pd, cq, cq, QpCaps::default()).unwrap();
        let to = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        eng.modify_qp(qpn, &QpAttr { access: Some(AccessFlags::ALL), ..to(QpState::Init) }).unwrap();
        let rtr = QpAttr {
            path_mtu: Some(1024),
            dest_qpn: Some(REMOTE_QPN),
            rq_psn: Some(R),
            peer: Some(PeerAddr { ip: peer, mac: REMOTE_MAC }),
            ..to(QpState::Rtr)
        };
        eng.modify_qp(qpn, &rtr).unwrap();
        eng.modify_qp(qpn, &QpAttr { sq_psn: Some(0x10_0000), ..to(QpState::Rts) }).unwrap();
        for i in 0..64 {
            eng.post_recv(qpn, i, &[roce_dp::Sge { addr: 2048, len: 1024, lkey: mr.lkey }]).unwrap();
        }
        let addrs = match peer {
            IpAddrs::V4 { src, dst } => IpAddrs::V4 { src: dst, dst: src },
            IpAddrs::V6 { src, dst } => IpAddrs::V6 { src: dst, dst: src },
        };
        Side { eng, qpn, cq, mr, addrs }
    }

    /// A frame from the peer: `op` with PSN `psn`, a RETH for WRITEs (to offset 0, `len` bytes), `len` bytes of
    /// payload.
    fn frame(&self, op: Opcode, psn: u32, len: usize) -> Vec<u8> {
        let mut r = RoceRepr { udp_dst: roce_dp::wire::ROCE_UDP_PORT, udp_src: 0xc000, ..RoceRepr::default() };
        r.eth.src = REMOTE_MAC;
        r.eth.dst = LOCAL_MAC;
        r.ip.addrs = self.addrs;
        r.ip.ttl = 64;
        r.bth.opcode = op;
        r.bth.dest_qp = self.qpn;
        r.bth.psn = Psn::new(psn);
        r.bth.ack_req = true;
        if op == Opcode::RC_RDMA_WRITE_ONLY {
            r.ext.reth = Some(RethRepr { va: 0, rkey: self.mr.rkey, len: len as u32 });
        }
        let mut buf = vec![0u8; 2048];
        let n = emit_frame(&mut buf, &r, len, |d| d.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8)).unwrap();
        buf.truncate(n);
        buf
    }

    /// What the frames did: counters, QP counters, completions, frames sent (the MR's bytes: `mr`).
    fn observe(&mut self) -> String {
        let mut s = format!("{:?} {:?}", self.eng.stats(), self.eng.qp_counters(self.qpn));
        while let Some(c) = self.eng.poll_cq_one(self.cq) {
            s += &format!(" {c:?}");
        }
        let mut buf = vec![0u8; 4096];
        while let Some(n) = self.eng.poll_transmit(Instant::ZERO, &mut buf) {
            s += &format!(" tx {:02x?}", &buf[..n]);
        }
        s
    }
}

/// Frames of both IP versions around the in-place threshold go to two engines, one through `handle_rx_mut`, the
/// other through `handle_rx`: small SENDs and WRITEs (in sequence and out of it), Ethernet padding making every
/// length from the frame's own to 40 bytes past it (145 and 146 among them), every bit flipped, every cut, random
/// tails: the same effects, and `handle_rx_mut` leaves each frame as it was.
#[test]
fn handle_rx_mut_equals_handle_rx_around_the_in_place_threshold_ipv4_and_ipv6() {
    for v6 in [false, true] {
        let (mut a, mut b) = (Side::new(v6), Side::new(v6));
        let mut rng = SimRng::new(if v6 { 6 } else { 4 });
        let mut lens = std::collections::BTreeSet::new();
        let mut psn = R;
        for round in 0..200u32 {
            let op = [Opcode::RC_SEND_ONLY, Opcode::RC_RDMA_WRITE_ONLY][round as usize % 2];
            let len = below(&mut rng, 60);
            // Mostly the next PSN (taken), sometimes a duplicate or one ahead (NAK'd / re-ACKed).
            let p = match below(&mut rng, 8) {
                0 => psn.wrapping_sub(1),
                1 => psn + 3,
                _ => psn,
            };
            let base = a.frame(op, p, len);
            let mut variants = vec![base.clone()];
            for extra in 0..=40 {
                let mut g = base.clone();
                g.extend((0..extra).map(|_| rng.next_u64() as u8));
                variants.push(g);
            }
            if round % 10 == 0 {
                for bit in 0..base.len() * 8 {
                    let mut g = base.clone();
                    g[bit / 8] ^= 1 << (bit % 8);
                    variants.push(g);
                }
                for n in 0..base.len() {
                    variants.push(base[..n].to_vec());
                }
            }
            for f in variants {
                lens.insert(f.len());
                let mut g = f.clone();
                a.eng.handle_rx_mut(Instant::ZERO, &mut g, RxMeta::default());
                assert!(g == f, "v6 {v6}: handle_rx_mut changed the frame");
                b.eng.handle_rx(Instant::ZERO, &f, RxMeta::default());
                assert_eq!(a.observe(), b.observe(), "v6 {v6}: {f:02x?}");
                assert!(
                    a.eng.mr_bytes(a.mr.lkey) == b.eng.mr_bytes(b.mr.lkey),
                    "v6 {v6}: memory differs after {f:02x?}"
                );
            }
            if p == psn {
                psn += 1;
            }
        }
        assert!(lens.contains(&145) && lens.contains(&146), "v6 {v6}: lengths {lens:?}");
        let s = a.eng.stats();
        assert!(s.rx_drop_icrc > 100 && a.eng.qp_counters(a.qpn).unwrap().rx_packets > 100, "v6 {v6}: {s:?}");
    }
}
