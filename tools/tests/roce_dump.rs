//! roce-dump end to end: the built binary on the rxe captures, on pcapng, on corrupted and unreadable files.

use pcap_file::pcap::{PcapPacket, PcapReader, PcapWriter};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn vectors_dir() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../roce-dp/tests/vectors/rxe"));
    assert!(dir.is_dir(), "rxe capture directory {} is missing from the checkout", dir.display());
    dir
}

fn run(args: &[&str], file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_roce-dump")).args(args).arg(file).output().expect("run roce-dump")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A path in the temp directory unique to this test process.
fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dump-test-{}-{name}", std::process::id()))
}

fn frames(file: &Path) -> Vec<(Duration, Vec<u8>)> {
    let mut r = PcapReader::new(std::fs::File::open(file).unwrap()).unwrap();
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        v.push((p.timestamp, p.data.into_owned()));
    }
    v
}

fn write_pcap(path: &Path, frames: &[(Duration, Vec<u8>)]) {
    let mut w = PcapWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    for (t, d) in frames {
        w.write_packet(&PcapPacket::new(*t, d.len() as u32, d)).unwrap();
    }
}

/// (capture, total frames, RoCE frames): totals from `tshark -r FILE | wc -l`, RoCE from `tshark -Y infiniband`.
const CAPTURES: &[(&str, u64, u64)] = &[
    ("drop5_write_tapa0.pcap", 304, 266),
    ("ecn_ce_all_write_tapa0.pcap", 139, 100),
    ("rc_atomic.pcap", 78, 40),
    ("rc_read_4k.pcap", 141, 100),
    ("rc_send_4k.pcap", 133, 100),
    ("rc_send_lat_64.pcap", 109, 80),
    ("rc_write_4k.pcap", 139, 100),
    ("rc_write_lat_64.pcap", 105, 80),
    ("uc_write_4k.pcap", 120, 80),
    ("ud_send_1k.pcap", 50, 20),
];

#[test]
fn every_capture_is_clean_in_every_mode() {
    let dir = vectors_dir();
    for &(name, total, roce) in CAPTURES {
        let summary = format!("frames={total} roce={roce} icrc_ok={roce} icrc_bad=0 malformed=0");
        for (mode, lines_per_frame) in
            [(&[][..], 1), (&["--verbose"][..], 3), (&["--json"][..], 1), (&["--json", "-v"][..], 1)]
        {
            let o = run(mode, &dir.join(name));
            assert_eq!(o.status.code(), Some(0), "{name} {mode:?}: {}", String::from_utf8_lossy(&o.stderr));
            let out = stdout(&o);
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.last(), Some(&summary.as_str()), "{name} {mode:?}");
            assert_eq!(lines.len() as u64, roce * lines_per_frame + 1, "{name} {mode:?}");
            if mode.contains(&"--json") {
                assert!(lines[..lines.len() - 1].iter().all(|l| l.starts_with("{\"ts\":") && l.ends_with('}')));
            }
        }
    }
}

#[test]
fn lines_carry_the_decoded_fields() {
    let out = stdout(&run(&[], &vectors_dir().join("rc_read_4k.pcap")));
    let count = |s: &str| out.lines().filter(|l| l.contains(s)).count();
    assert_eq!(count(" RC_RDMA_READ_REQUEST "), 20);
    assert_eq!(count(" RC_RDMA_READ_RESPONSE_FIRST "), 20);
    assert_eq!(count(" RC_RDMA_READ_RESPONSE_MIDDLE "), 40);
    assert_eq!(count(" RC_RDMA_READ_RESPONSE_LAST "), 20);
    assert_eq!(count(" reth{va=0x55cf5fae6000 rkey=0x219d len=4096} len=0 "), 20);
    assert_eq!(count(" aeth{ACK syn=0x1f credits=31 msn="), 40);
    let first = out.lines().next().unwrap();
    assert!(first.contains(" 10.50.0.1:51456 -> 10.50.0.2:4791 RC_RDMA_READ_REQUEST dqp=0x000030 psn=0x90ab9d "));
    let drop = stdout(&run(&[], &vectors_dir().join("drop5_write_tapa0.pcap")));
    assert_eq!(drop.lines().filter(|l| l.contains(" aeth{NAK syn=0x60 code=PSN_SEQ_ERR msn=")).count(), 4);
    let ecn = stdout(&run(&[], &vectors_dir().join("ecn_ce_all_write_tapa0.pcap")));
    assert_eq!(ecn.lines().filter(|l| l.contains(" ecn=11 icrc=ok")).count(), 20);
}

#[test]
fn pcapng_gives_the_same_lines() {
    let src = vectors_dir().join("rc_write_4k.pcap");
    let path = temp("w.pcapng");
    let mut w = PcapNgWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
    let idb = InterfaceDescriptionBlock {
        linktype: DataLink::ETHERNET,
        snaplen: 0,
        options: vec![InterfaceDescriptionOption::IfTsResol(9)],
    };
    w.write_pcapng_block(idb).unwrap();
    for (t, d) in frames(&src) {
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: t,
            original_len: d.len() as u32,
            data: Cow::Owned(d),
            options: vec![],
        };
        w.write_pcapng_block(epb).unwrap();
    }
    drop(w);
    let (a, b) = (run(&[], &src), run(&[], &path));
    std::fs::remove_file(&path).unwrap();
    assert_eq!(b.status.code(), Some(0), "{}", String::from_utf8_lossy(&b.stderr));
    assert_eq!(stdout(&a), stdout(&b));
}

#[test]
fn a_corrupted_frame_exits_1() {
    let mut f = frames(&vectors_dir().join("rc_write_4k.pcap"));
    let roce: Vec<usize> = (0..f.len()).filter(|&i| f[i].1.len() > 42 && f[i].1[36..38] == [0x12, 0xb7]).collect();
    // One payload bit flipped (bad ICRC), one BTH version set (malformed).
    let (a, b) = (roce[3], roce[7]);
    f[a].1[100] ^= 0x04;
    f[b].1[43] |= 0x01;
    let path = temp("corrupt.pcap");
    write_pcap(&path, &f);
    let o = run(&[], &path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    assert_eq!(out.lines().last(), Some("frames=139 roce=100 icrc_ok=98 icrc_bad=1 malformed=1"));
    assert_eq!(out.lines().filter(|l| l.ends_with(" icrc=BAD")).count(), 1);
    let bad = out.lines().find(|l| l.contains("MALFORMED")).unwrap();
    assert!(bad.ends_with(&format!("MALFORMED frame={} reason=\"bad BTH transport version\"", b + 1)), "{bad}");
}

#[test]
fn unreadable_files_exit_2_with_one_line() {
    let garbage = temp("garbage.pcap");
    std::fs::write(&garbage, b"this is not a capture file at all").unwrap();
    let truncated = temp("truncated.pcap");
    let whole = std::fs::read(vectors_dir().join("rc_write_4k.pcap")).unwrap();
    std::fs::write(&truncated, &whole[..30]).unwrap();
    // An 802.11 capture: readable, but no link type roce-dump decodes.
    let sll = temp("wlan.pcap");
    let header = pcap_file::pcap::PcapHeader { datalink: DataLink::IEEE802_11, ..Default::default() };
    pcap_file::pcap::PcapWriter::with_header(std::fs::File::create(&sll).unwrap(), header).unwrap();
    for (path, reason) in [
        (sll.clone(), "unsupported link type"),
        (temp("missing.pcap"), "No such file"),
        (garbage.clone(), "not a pcap/pcapng file"),
        (truncated.clone(), "truncated capture file"),
    ] {
        let o = run(&[], &path);
        assert_eq!(o.status.code(), Some(2), "{}", path.display());
        let err = String::from_utf8(o.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("roce-dump: ") && err.contains(reason), "{err}");
        assert!(o.stdout.is_empty());
    }
    std::fs::remove_file(garbage).unwrap();
    std::fs::remove_file(sll).unwrap();
    std::fs::remove_file(truncated).unwrap();
}
