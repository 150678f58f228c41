//! The wire layer against real bytes: Linux rxe captures (tests/vectors/rxe, vendored from ../shared/vectors/rxe), an
//! independent implementation.

mod common;

use common::{load, vectors_dir, CAPTURES};
use roce_dp::wire::{
    emit_frame, icrc, op, parse_frame, parse_frame_checked, rxe_ud_udp_sport, rxe_udp_sport, AethKind, Ecn, Error,
    IpAddrs, Ipv4Packet, NakCode, Opcode,
};
use std::collections::BTreeMap;

/// Byte offset of the IP header in an (untagged) capture frame.
const L3: usize = 14;

#[test]
fn every_capture_is_listed() {
    let mut on_disk: Vec<String> = std::fs::read_dir(vectors_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pcap") || n.ends_with(".pcapng"))
        .collect();
    on_disk.sort();
    let listed: Vec<&str> = CAPTURES.iter().map(|c| c.name).collect();
    assert_eq!(on_disk, listed, "a capture was added or removed: update CAPTURES with its tshark counts");
}

/// The vendored copy is the shared one, byte for byte, when `shared/` sits beside the clone (a CI clone without it
/// runs on the copy alone, and says so).
#[test]
fn vendored_captures_equal_the_shared_ones() {
    let Some(shared) = common::shared_vectors_dir() else {
        eprintln!("shared/vectors/rxe is not beside this clone: the vendored copy in tests/vectors/rxe is used alone");
        return;
    };
    let names = |d: &std::path::Path| {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&vectors_dir()), names(&shared), "vendored and shared vector files differ");
    for n in names(&shared) {
        let a = std::fs::read(vectors_dir().join(&n)).unwrap();
        let b = std::fs::read(shared.join(&n)).unwrap();
        assert!(a == b, "{n}: the vendored copy differs from shared/vectors/rxe/{n}");
    }
}

#[test]
fn every_capture_decodes_with_the_tshark_opcode_counts() {
    for c in CAPTURES {
        let frames = load(c.name);
        assert_eq!(frames.len(), c.frames, "{}", c.name);
        let mut counts: BTreeMap<u8, usize> = BTreeMap::new();
        let (mut other, mut malformed, mut bad_icrc) = (0, Vec::new(), 0);
        for (i, (_, f)) in frames.iter().enumerate() {
            match parse_frame(f) {
                Ok(p) => {
                    *counts.entry(p.repr.bth.opcode.0).or_default() += 1;
                    bad_icrc += usize::from(!p.icrc_ok);
                }
                Err(Error::NotIp | Error::NotUdp | Error::NotRoce) => other += 1,
                Err(e) => malformed.push((i + 1, e)),
            }
        }
        assert_eq!(malformed, vec![], "{}: malformed frames (frame number, reason)", c.name);
        assert_eq!(bad_icrc, 0, "{}", c.name);
        let expect: BTreeMap<u8, usize> = c.opcodes.iter().copied().collect();
        assert_eq!(counts, expect, "{}: per-opcode counts differ from tshark's", c.name);
        assert_eq!(other + counts.values().sum::<usize>(), c.frames);
    }
}

#[test]
fn parse_then_emit_gives_the_original_bytes() {
    let mut n = 0;
    for c in CAPTURES {
        for (i, (_, f)) in load(c.name).iter().enumerate() {
            let Ok(p) = parse_frame_checked(f) else { continue };
            let mut out = vec![0xa5u8; f.len() + 16];
            let len = emit_frame(&mut out, &p.repr, p.payload.len(), |b| b.copy_from_slice(p.payload)).unwrap();
            assert_eq!(&out[..len], &f[..], "{} frame {}: re-emitted bytes differ", c.name, i + 1);
            n += 1;
        }
    }
    assert_eq!(n, 966);
}

/// Bits the ICRC does not cover, as offsets from the IPv4 header: TOS (DSCP+ECN), TTL, header checksum, UDP
/// checksum, BTH byte 4.
fn masked_v4(off: usize) -> bool {
    matches!(off, 1 | 8 | 10 | 11 | 26 | 27 | 32)
}

#[test]
fn only_masked_bits_keep_the_icrc_valid() {
    // One frame of every opcode in the captures (SEND/WRITE/READ/atomic/ACK/NAK/UC/UD), every bit of every byte
    // from the IP header to the ICRC.
    let mut seen = BTreeMap::new();
    for c in CAPTURES {
        for (_, f) in load(c.name) {
            if let Ok(p) = parse_frame(&f) {
                seen.entry(p.repr.bth.opcode.0).or_insert(f);
            }
        }
    }
    assert_eq!(seen.len(), 19);
    for (opc, f) in &seen {
        let pkt = &f[L3..];
        assert_eq!(icrc::verify(pkt), Ok(true));
        let mut m = pkt.to_vec();
        for off in 0..m.len() {
            for bit in 0..8 {
                m[off] ^= 1 << bit;
                let r = icrc::verify(&m);
                if masked_v4(off) {
                    assert_eq!(r, Ok(true), "opcode {opc:#x}: flipping masked byte {off} bit {bit} broke the ICRC");
                } else {
                    assert_ne!(r, Ok(true), "opcode {opc:#x}: flipping byte {off} bit {bit} kept the ICRC valid");
                }
                m[off] ^= 1 << bit;
            }
        }
    }
}

#[test]
fn ecn_dscp_ttl_rewrites_keep_frames_valid() {
    // The ECN capture: the bridge marked CE on what it forwarded (the responder's ACKs, seen on the sender's tap).
    let mut ce = 0;
    for (_, f) in load("ecn_ce_all_write_tapa0.pcap") {
        if let Ok(p) = parse_frame_checked(&f) {
            if p.repr.ip.ecn == Ecn::Ce {
                ce += 1;
                assert_eq!(p.repr.bth.opcode, Opcode::RC_ACKNOWLEDGE);
            }
        }
    }
    assert_eq!(ce, 20);
    // A router rewriting TOS and TTL (and fixing the IPv4 checksum) must not break the ICRC.
    for (_, f) in load("rc_write_4k.pcap") {
        if parse_frame(&f).is_err() {
            continue;
        }
        let mut g = f.clone();
        g[L3 + 1] = (46 << 2) | 3;
        g[L3 + 8] = 3;
        let mut ip = Ipv4Packet::new_unchecked(&mut g[L3..]);
        ip.fill_checksum();
        let p = parse_frame_checked(&g).unwrap();
        assert_eq!((p.repr.ip.ecn, p.repr.ip.dscp, p.repr.ip.ttl), (Ecn::Ce, 46, 3));
    }
}

/// (local, remote) QPN from a NAME.perftest.txt (the client's lines, not the server's `[srv]` echo).
fn perftest_qpns(capture: &str) -> (u32, u32) {
    let path = vectors_dir().join(capture.replace(".pcap", ".perftest.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let qpn = |tag: &str| {
        let line = text.lines().find(|l| l.trim_start().starts_with(tag)).unwrap();
        let hex = line.split("QPN 0x").nth(1).unwrap().split_whitespace().next().unwrap();
        u32::from_str_radix(hex, 16).unwrap()
    };
    (qpn("local address:"), qpn("remote address:"))
}

#[test]
fn udp_source_ports_follow_rxe() {
    for c in CAPTURES {
        assert_eq!(perftest_qpns(c.name), c.qpns, "{}", c.name);
        let (l, r) = c.qpns;
        for (_, f) in load(c.name) {
            let Ok(p) = parse_frame(&f) else { continue };
            let b = p.repr.bth;
            assert!(b.dest_qp == l || b.dest_qp == r, "{}: dest QP {:#x}", c.name, b.dest_qp);
            let expect = if b.opcode.has(op::UD) {
                rxe_ud_udp_sport(p.repr.ext.deth.unwrap().src_qp)
            } else {
                rxe_udp_sport(l, r)
            };
            assert_eq!(p.repr.udp_src, expect, "{} {}", c.name, b.opcode);
        }
    }
}

#[test]
fn header_fields_match_the_runs() {
    let roce = |name: &str| -> Vec<_> {
        load(name)
            .into_iter()
            .filter_map(|(_, f)| parse_frame_checked(&f).ok().map(|p| (p.repr, p.payload.len())))
            .collect()
    };
    // rxe facts: IPv4, DF, TTL 64, DSCP 0, P_Key 0xffff, UDP checksum 0 (checked by the round trip).
    for (r, _) in roce("rc_write_4k.pcap") {
        assert!(matches!(r.ip.addrs, IpAddrs::V4 { .. }));
        assert_eq!((r.ip.dont_frag, r.ip.ttl, r.ip.dscp, r.bth.pkey), (true, 64, 0, 0xffff));
        if r.bth.opcode == Opcode::RC_RDMA_WRITE_FIRST {
            let reth = r.ext.reth.unwrap();
            assert_eq!((reth.va, reth.rkey, reth.len), (0x55ca_1e0e_b000, 0x2059, 4096));
        }
    }
    // READ: requests carry a RETH of 4096 bytes, responses First/Last carry an AETH, MTU 1024.
    for (r, len) in roce("rc_read_4k.pcap") {
        let o = r.bth.opcode;
        assert_eq!(r.ext.reth.map(|x| x.len), o.has(op::READ | op::REQ).then_some(4096));
        assert_eq!(r.ext.aeth.is_some(), o.has(op::RESP) && !o.has(op::MIDDLE));
        if o.has(op::RESP) {
            assert_eq!(len, 1024);
        }
    }
    // Atomics: FETCH_ADD with AtomicETH, answered by ATOMIC_ACKNOWLEDGE with AtomicAckETH and an ACK AETH.
    for (r, _) in roce("rc_atomic.pcap") {
        assert_eq!(r.ext.atomic_eth.is_some(), r.bth.opcode == Opcode::RC_FETCH_ADD);
        assert_eq!(r.ext.atomic_ack.is_some(), r.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE);
    }
    // 5% loss: 25 ACKs and 4 NAKs (PSN sequence error), per tshark's infiniband.aeth.syndrome.
    let kinds: Vec<AethKind> =
        roce("drop5_write_tapa0.pcap").iter().filter_map(|(r, _)| r.ext.aeth).map(|a| a.kind()).collect();
    assert_eq!(kinds.iter().filter(|k| matches!(k, AethKind::Ack { credits: 31 })).count(), 25);
    assert_eq!(kinds.iter().filter(|k| **k == AethKind::Nak(NakCode::PsnSeqErr)).count(), 4);
    // UD: DETH with Q_Key 0x11111111 and the sender's QPN, 1 KiB payload.
    for (r, len) in roce("ud_send_1k.pcap") {
        assert_eq!(r.ext.deth.map(|d| (d.qkey, d.src_qp)), Some((0x1111_1111, 0x12)));
        assert_eq!(len, 1024);
    }
}
