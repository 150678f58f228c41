//! Loading the Linux rxe captures: a copy of ../shared/vectors/rxe vendored in tests/vectors/rxe (so a clone
//! without `shared/` beside it still runs every test; `vendored_captures_equal_the_shared_ones` checks the copy).

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

/// The capture directory (the vendored copy). Panics (the test fails) with a clear message when it is missing: these
/// tests check the wire layer against an independent implementation and must never pass by skipping.
pub fn vectors_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/rxe"));
    assert!(dir.is_dir(), "rxe capture directory {} is missing from the checkout", dir.display());
    dir
}

/// `shared/vectors/rxe` beside the repository (the source of the vendored copy), if it is there.
pub fn shared_vectors_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/vectors/rxe"));
    dir.is_dir().then_some(dir)
}

/// The frames of one capture: (timestamp, bytes).
pub fn load(name: &str) -> Vec<(std::time::Duration, Vec<u8>)> {
    let path = vectors_dir().join(name);
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut r = pcap_file::pcap::PcapReader::new(file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(p.orig_len as usize, p.data.len(), "{name}: frame cut by the snap length");
        out.push((p.timestamp, p.data.into_owned()));
    }
    out
}

/// Every RoCE frame of every capture, with the capture's name.
pub fn all_roce_frames() -> Vec<(&'static str, Vec<u8>)> {
    let mut v = Vec::new();
    for c in CAPTURES {
        for (_, f) in load(c.name) {
            if roce_dp::wire::parse_frame(&f).is_ok() {
                v.push((c.name, f));
            }
        }
    }
    v
}

/// What each capture holds, counted independently of this crate with
/// `tshark -r FILE -Y infiniband -T fields -e infiniband.bth.opcode | sort | uniq -c` (opcode, count), and
/// `tshark -r FILE | wc -l` for the frame total (the rest are perftest's TCP exchange).
pub struct Capture {
    pub name: &'static str,
    pub frames: usize,
    pub opcodes: &'static [(u8, usize)],
    /// The two QPNs of the perftest run (NAME.perftest.txt "local address"/"remote address").
    pub qpns: (u32, u32),
}

pub const CAPTURES: &[Capture] = &[
    Capture {
        name: "drop5_write_tapa0.pcap",
        frames: 304,
        opcodes: &[(6, 58), (7, 118), (8, 61), (17, 29)],
        qpns: (0x35, 0x35),
    },
    Capture {
        name: "ecn_ce_all_write_tapa0.pcap",
        frames: 139,
        opcodes: &[(6, 20), (7, 40), (8, 20), (17, 20)],
        qpns: (0x38, 0x38),
    },
    Capture { name: "rc_atomic.pcap", frames: 78, opcodes: &[(18, 20), (20, 20)], qpns: (0x31, 0x31) },
    Capture {
        name: "rc_read_4k.pcap",
        frames: 141,
        opcodes: &[(12, 20), (13, 20), (14, 40), (15, 20)],
        qpns: (0x30, 0x30),
    },
    Capture {
        name: "rc_send_4k.pcap",
        frames: 133,
        opcodes: &[(0, 20), (1, 40), (2, 20), (17, 20)],
        qpns: (0x2e, 0x2e),
    },
    Capture { name: "rc_send_lat_64.pcap", frames: 109, opcodes: &[(4, 40), (17, 40)], qpns: (0x32, 0x32) },
    Capture {
        name: "rc_write_4k.pcap",
        frames: 139,
        opcodes: &[(6, 20), (7, 40), (8, 20), (17, 20)],
        qpns: (0x2f, 0x2f),
    },
    Capture { name: "rc_write_lat_64.pcap", frames: 105, opcodes: &[(10, 40), (17, 40)], qpns: (0x33, 0x33) },
    Capture { name: "uc_write_4k.pcap", frames: 120, opcodes: &[(38, 20), (39, 40), (40, 20)], qpns: (0x13, 0x13) },
    Capture { name: "ud_send_1k.pcap", frames: 50, opcodes: &[(100, 20)], qpns: (0x12, 0x12) },
];

/// The INIT, RTR and RTS attributes that connect a QP of a raw control-protocol session to `dest_qpn` over the
/// loopback engine (path MTU 1024, PSNs 0, 4 reads/atomics each way, ACK timeout exponent 10, one retry).
pub fn raw_connect_attrs(dest_qpn: u32) -> [roce_dp::QpAttr; 3] {
    use roce_dp::{AccessFlags, QpAttr, QpState};
    [
        QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() },
        QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(1024),
            dest_qpn: Some(dest_qpn),
            rq_psn: Some(0),
            max_dest_rd_atomic: Some(4),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(10),
            retry_cnt: Some(1),
            max_rd_atomic: Some(4),
            ..QpAttr::default()
        },
    ]
}

/// Registers a region whose keys equal `key` (= `index << 8 | generation`, roce-dp/src/mr.rs) using only the
/// public verbs: zero-length placeholders fill the slots below `index`, then slot `index` is registered (zero
/// length) and deregistered until the generation it just used is the one before the wanted one, so the real
/// registration that follows gets exactly `key`. No test-only engine API is needed.
pub fn reg_mr_with_key(eng: &mut roce_dp::Engine, pd: roce_dp::Pd, va: u64, len: usize, key: u32) -> roce_dp::MrKeys {
    let index = key >> 8;
    let prev_gen = (key & 0xff).wrapping_sub(1) & 0xff;
    for _ in 0..index {
        eng.reg_mr(pd, 0, 0, roce_dp::AccessFlags::NONE).unwrap();
    }
    for _ in 0..=256 {
        let k = eng.reg_mr(pd, va, 0, roce_dp::AccessFlags::NONE).unwrap();
        assert_eq!(k.lkey >> 8, index, "the MR table does not hand out slots in order");
        assert!(eng.dereg_mr(k.lkey));
        if k.lkey & 0xff == prev_gen {
            let keys = eng.reg_mr(pd, va, len, roce_dp::AccessFlags::ALL).unwrap();
            assert_eq!((keys.lkey, keys.rkey), (key, key));
            return keys;
        }
    }
    panic!("key {key:#x} never produced");
}
