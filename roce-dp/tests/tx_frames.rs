//! Every frame the engine sends, over many QP attribute combinations, is the frame the plain encoder writes for its
//! headers: two engines with random addressing (IPv4 or IPv6), DSCP, ECN, TTL, path MTU and PSNs run a random mix
//! of SEND (with immediate, inline), WRITE (with immediate), READ and atomics both ways over a link that loses and
//! CE-marks frames, with DCQCN on (so CNPs are sent) and the DSCP changed in RTS halfway. Each frame
//! `poll_transmit` writes (through the header template's fast path: prebuilt BTH words, the ICRC pass prepared in
//! the frame, the masked LRH in the Ethernet header's last 8 bytes and put back) is checked against
//! `wire::emit_frame` of its parsed headers and payload, against the ICRC as the spec words it (computed here), and
//! against the QP's attributes (MACs, addresses, DSCP/ECN/TTL, UDP ports, P_Key, destination QP; a CNP's DSCP and
//! Not-ECT). Requests, retransmissions, ACKs, NAKs, READ responses, atomic ACKs and CNPs must all have been seen.

use std::collections::BTreeMap;

use roce_dp::engine::MAX_HEADER_BYTES;
use roce_dp::wire::{self, emit_frame, parse_frame, Ecn, IpAddrs, MacAddr, Opcode};
use roce_dp::{
    AccessFlags, CcAlgorithm, CcConfig, DcqcnConfig, Duration, Engine, EngineConfig, Instant, LocalIp, MrKeys,
    PeerAddr, QpAttr, QpCaps, QpState, RxMeta, SendWr, Sge, WrOpcode,
};

const MAC: [MacAddr; 2] = [MacAddr([2, 0, 0, 0, 0, 0x11]), MacAddr([2, 0, 0, 0, 0, 0x22])];
const IP4: [[u8; 4]; 2] = [[192, 168, 7, 1], [192, 168, 7, 2]];
const IP6: [[u8; 16]; 2] = [
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x70, 1],
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x70, 2],
];
const VA: u64 = 0x4000_0000;
const LEN: usize = 1 << 16;
/// A CNP's DSCP (DcqcnConfig::np_cnp_dscp).
const CNP_DSCP: u8 = 46;

fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The ICRC as ROCE-NOTES §1.7 words it: CRC-32 over 8 x 0xFF, the IP header with its variant fields all ones, the
/// UDP header with the checksum all ones, the BTH with byte 4 all ones, the rest up to the ICRC.
fn spec_icrc(ip_to_icrc: &[u8]) -> u32 {
    let mut m = ip_to_icrc[..ip_to_icrc.len() - 4].to_vec();
    let udp = if m[0] >> 4 == 4 {
        for i in [1, 8, 10, 11] {
            m[i] = 0xff;
        }
        20
    } else {
        m[0] |= 0x0f;
        for i in [1, 2, 3, 7] {
            m[i] = 0xff;
        }
        40
    };
    for i in [udp + 6, udp + 7, udp + 12] {
        m[i] = 0xff;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(&m);
    h.finalize()
}

/// Sets CE in an ECN-capable frame's IP header (IPv4: the header checksum updated). False if Not-ECT.
fn mark_ce(f: &mut [u8]) -> bool {
    match f[12..14] {
        [0x08, 0x00] => roce_dp::sim::incast::mark_ce(f),
        [0x86, 0xdd] => {
            // Traffic class: the low nibble of byte 0 and the high nibble of byte 1; ECN is its low two bits.
            let ecn = (f[15] >> 4) & 3;
            f[15] |= 0x30;
            ecn != 0
        }
        _ => false,
    }
}

/// What one QP's frames must carry.
#[derive(Clone, Copy, Debug)]
struct Flow {
    v6: bool,
    dscp: u8,
    ecn: Ecn,
    ttl: u8,
    qpn: u32,
    dest: u32,
}

#[derive(Default)]
struct Seen {
    ops: BTreeMap<u8, u32>,
    frames: u32,
    with_lrh: u32,
    retransmitted: u64,
}

/// Checks one frame node `n` sent on `flow`.
fn check(frame: &[u8], n: usize, flow: &Flow, seen: &mut Seen, what: &str) {
    let f = parse_frame(frame).unwrap_or_else(|e| panic!("{what}: node {n} sent a frame that does not parse: {e:?}"));
    assert!(f.icrc_ok, "{what}: ICRC");
    let r = f.repr;
    let mut again = vec![0u8; frame.len() + 64];
    let m = emit_frame(&mut again, &r, f.payload.len(), |d| d.copy_from_slice(f.payload)).expect("re-encodes");
    assert_eq!(
        &again[..m],
        frame,
        "{what}: node {n}'s {:?} is not what emit_frame writes for its headers",
        r.bth.opcode
    );
    let eth = r.eth.buffer_len();
    assert_eq!(spec_icrc(&frame[eth..]).to_le_bytes(), frame[frame.len() - 4..], "{what}: the spec's ICRC");
    assert_eq!((r.eth.src, r.eth.dst, r.eth.vlan), (MAC[n], MAC[1 - n], None), "{what}: Ethernet header");
    let want_ip = if flow.v6 {
        IpAddrs::V6 { src: IP6[n], dst: IP6[1 - n] }
    } else {
        IpAddrs::V4 { src: IP4[n], dst: IP4[1 - n] }
    };
    assert_eq!(r.ip.addrs, want_ip, "{what}");
    let cnp = r.bth.opcode == Opcode::CNP;
    let (dscp, ecn) = if cnp { (CNP_DSCP, Ecn::NotEct) } else { (flow.dscp, flow.ecn) };
    assert_eq!((r.ip.dscp, r.ip.ecn, r.ip.ttl), (dscp, ecn, flow.ttl), "{what}: {:?}", r.bth.opcode);
    assert_eq!(r.ip.dont_frag, !flow.v6, "{what}");
    assert_eq!((r.udp_src, r.udp_dst), (wire::rxe_udp_sport(flow.qpn, flow.dest), wire::ROCE_UDP_PORT), "{what}");
    assert_eq!((r.bth.pkey, r.bth.dest_qp, r.bth.fecn, r.bth.becn), (0xffff, flow.dest, false, cnp), "{what}");
    seen.frames += 1;
    seen.with_lrh += u32::from((frame.len() - eth - 4) % 16 == 8);
    *seen.ops.entry(r.bth.opcode.0).or_default() += 1;
}

fn dcqcn() -> CcConfig {
    CcConfig {
        algorithm: CcAlgorithm::Dcqcn,
        line_rate_mbps: 100_000,
        dcqcn: DcqcnConfig { np_min_time_between_cnps: 2, np_cnp_dscp: CNP_DSCP, ..DcqcnConfig::default() },
        ..CcConfig::default()
    }
}

/// One trial: a QP pair with random attributes, `wrs` random WRs posted on each side, run to the end.
fn trial(seed: u64, seen: &mut Seen) {
    let mut rnd = xorshift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let v6 = rnd().is_multiple_of(2);
    let mtu = [256u32, 512, 1024, 2048, 4096][(rnd() % 5) as usize];
    let mk = |n: usize| {
        Engine::new(EngineConfig {
            local_mac: MAC[n],
            local_ip: LocalIp { v4: Some(IP4[n]), v6: Some(IP6[n]) },
            qpn_base: 0x40 + 0x1000 * n as u32,
            cc: dcqcn(),
            ..EngineConfig::default()
        })
    };
    let mut e = [mk(0), mk(1)];
    let (mut qpn, mut cq, mut keys) = ([0u32; 2], Vec::new(), Vec::<MrKeys>::new());
    for (n, eng) in e.iter_mut().enumerate() {
        let pd = eng.alloc_pd();
        cq.push(eng.create_cq(4096).unwrap());
        keys.push(eng.reg_mr(pd, VA, LEN, AccessFlags::ALL).unwrap());
        let caps = QpCaps { max_inline: 256, ..QpCaps::default() };
        qpn[n] = eng.create_qp(pd, cq[n], cq[n], caps).unwrap();
        let bytes = eng.mr_bytes_mut(keys[n].lkey).unwrap();
        bytes.iter_mut().enumerate().for_each(|(i, b)| *b = (i as u64 ^ seed) as u8);
    }
    let mut flows = Vec::new();
    let psn = [rnd() as u32 & 0xff_ffff, rnd() as u32 & 0xff_ffff];
    for n in 0..2 {
        let ecn = [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ect0][(rnd() % 4) as usize];
        let flow = Flow { v6, dscp: (rnd() % 64) as u8, ecn, ttl: rnd() as u8 | 1, qpn: qpn[n], dest: qpn[1 - n] };
        let peer = if v6 {
            PeerAddr { ip: IpAddrs::V6 { src: [0; 16], dst: IP6[1 - n] }, mac: MAC[1 - n] }
        } else {
            PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: IP4[1 - n] }, mac: MAC[1 - n] }
        };
        let q = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        e[n].modify_qp(qpn[n], &QpAttr { access: Some(AccessFlags::ALL), ..q(QpState::Init) }).unwrap();
        let rtr = QpAttr {
            path_mtu: Some(mtu),
            dest_qpn: Some(qpn[1 - n]),
            rq_psn: Some(psn[1 - n]),
            max_dest_rd_atomic: Some(4),
            peer: Some(peer),
            dscp: Some(flow.dscp),
            ecn: Some(flow.ecn),
            ttl: Some(flow.ttl),
            ..q(QpState::Rtr)
        };
        e[n].modify_qp(qpn[n], &rtr).unwrap();
        let rts = QpAttr {
            sq_psn: Some(psn[n]),
            timeout: Some(4),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(4),
            ..q(QpState::Rts)
        };
        e[n].modify_qp(qpn[n], &rts).unwrap();
        flows.push(flow);
    }
    // Receives for every SEND and WRITE with immediate the peer may post.
    let wrs = 24u64;
    for (n, eng) in e.iter_mut().enumerate() {
        for k in 0..wrs {
            let sge = Sge { addr: VA + (LEN / 2) as u64, len: (LEN / 4) as u32, lkey: keys[n].lkey };
            eng.post_recv(qpn[n], 1000 + k, &[sge]).unwrap();
        }
    }
    let ops = [
        WrOpcode::Send,
        WrOpcode::SendWithImm,
        WrOpcode::RdmaWrite,
        WrOpcode::RdmaWriteWithImm,
        WrOpcode::RdmaRead,
        WrOpcode::RdmaRead,
        WrOpcode::AtomicFetchAdd,
        WrOpcode::AtomicCmpSwp,
    ];
    let mut posted = [0u32; 2];
    for n in 0..2 {
        for k in 0..wrs {
            let op = ops[(rnd() % ops.len() as u64) as usize];
            let atomic = matches!(op, WrOpcode::AtomicFetchAdd | WrOpcode::AtomicCmpSwp);
            let len = if atomic { 8 } else { (rnd() % (3 * u64::from(mtu) + 40)) as u32 };
            let off = if atomic { 8 * (rnd() % 64) } else { rnd() % (LEN as u64 / 4) };
            let mut wr = SendWr::new(k, op).remote(VA + off, keys[1 - n].rkey);
            wr.imm = rnd() as u32;
            wr.compare_add = rnd();
            wr.swap = rnd();
            wr.inline = matches!(op, WrOpcode::Send | WrOpcode::RdmaWrite) && len <= 256 && rnd().is_multiple_of(2);
            let local = if op == WrOpcode::RdmaRead { VA + (LEN / 4 * 3) as u64 } else { VA + rnd() % 4096 };
            e[n].post_send(qpn[n], &wr, &[Sge { addr: local, len, lkey: keys[n].lkey }]).unwrap();
            posted[n] += 1;
        }
    }
    let mut buf = vec![0u8; 4096 + MAX_HEADER_BYTES];
    let mut done = [0u32; 2];
    let mut now = Instant::ZERO;
    let mut dscp_changed = false;
    for step in 0..200_000u32 {
        for n in 0..2 {
            if e[n].poll_timeout().is_some_and(|t| t <= now) {
                e[n].handle_timeout(now);
            }
            // Junk in the buffer: the frame must not depend on what the last one left.
            buf.iter_mut().for_each(|b| *b = rnd() as u8);
            while let Some(len) = e[n].poll_transmit(now, &mut buf) {
                let what = format!("seed {seed} step {step} v6 {v6} mtu {mtu} {:?}", flows[n]);
                let mut f = buf[..len].to_vec();
                check(&f, n, &flows[n], seen, &what);
                buf.iter_mut().for_each(|b| *b = rnd() as u8);
                match rnd() % 100 {
                    0..=2 => continue, // lost
                    3..=22 => {
                        mark_ce(&mut f);
                    }
                    _ => {}
                }
                e[1 - n].handle_rx(now, &f, RxMeta::default());
            }
            while let Some(x) = e[n].poll_cq_one(cq[n]) {
                {
                    if x.qpn == qpn[n] && x.wr_id < 1000 {
                        assert_eq!(x.status, roce_dp::WcStatus::Success, "seed {seed}: {x:?}");
                        done[n] += 1;
                    }
                }
            }
        }
        if !dscp_changed && done[0] + done[1] >= (posted[0] + posted[1]) / 2 {
            // A DSCP change in RTS: the header template is rebuilt and the frames carry the new value.
            dscp_changed = true;
            let d = (flows[0].dscp + 17) % 64;
            e[0].modify_qp(qpn[0], &QpAttr { state: Some(QpState::Rts), dscp: Some(d), ..QpAttr::default() }).unwrap();
            flows[0].dscp = d;
        }
        if done == posted {
            for n in 0..2 {
                seen.retransmitted += e[n].qp_counters(qpn[n]).unwrap().retransmitted_packets;
            }
            return;
        }
        now += Duration::from_nanos(500);
    }
    panic!("seed {seed}: not done ({done:?} of {posted:?} WRs completed)");
}

#[test]
fn every_frame_the_engine_sends_is_the_plain_encoders() {
    let mut seen = Seen::default();
    for seed in 1..=60 {
        trial(seed, &mut seen);
    }
    let n = |op: Opcode| seen.ops.get(&op.0).copied().unwrap_or(0);
    for op in [
        Opcode::RC_SEND_ONLY,
        Opcode::RC_SEND_FIRST,
        Opcode::RC_SEND_LAST_WITH_IMMEDIATE,
        Opcode::RC_RDMA_WRITE_FIRST,
        Opcode::RC_RDMA_WRITE_MIDDLE,
        Opcode::RC_RDMA_WRITE_ONLY,
        Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        Opcode::RC_RDMA_READ_RESPONSE_LAST,
        Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        Opcode::RC_COMPARE_SWAP,
        Opcode::RC_FETCH_ADD,
        Opcode::RC_ATOMIC_ACKNOWLEDGE,
        Opcode::RC_ACKNOWLEDGE,
        Opcode::CNP,
    ] {
        assert!(n(op) > 0, "no {op:?} among the frames checked: {:?}", seen.ops);
    }
    assert!(seen.retransmitted > 50, "{} frames retransmitted", seen.retransmitted);
    assert!(
        seen.frames > 5000 && seen.with_lrh > 200,
        "{} frames, {} of them LRH-prepared",
        seen.frames,
        seen.with_lrh
    );
}
