//! Session 9's audit of the tools' inputs from files: roce-dump on pcap and pcapng captures that are cut short,
//! mutated byte by byte, or claim records of gigabytes. The rule (README, tools): exit 0 or 1 with the summary line
//! when the file reads, exit 2 with exactly one line `roce-dump: FILE: reason` when it does not; never a panic, never
//! an allocation of what a length field claims.

mod common;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::DataLink;
use roce_dp::sim::SimRng;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::Command;

fn capture() -> Vec<u8> {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/../roce-dp/tests/vectors/rxe/rc_atomic.pcap");
    std::fs::read(p).expect("the rxe capture")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dump-audit-{}-{name}", std::process::id()))
}

/// The same frames as a pcapng file with one Ethernet interface.
fn as_pcapng(pcap: &[u8]) -> Vec<u8> {
    let mut r = PcapReader::new(pcap).unwrap();
    let mut out = Vec::new();
    let mut w = PcapNgWriter::new(&mut out).unwrap();
    w.write_pcapng_block(InterfaceDescriptionBlock { linktype: DataLink::ETHERNET, snaplen: 0, options: vec![] })
        .unwrap();
    while let Some(p) = r.next_packet() {
        let p = p.unwrap();
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: p.timestamp,
            original_len: p.orig_len,
            data: Cow::Owned(p.data.into_owned()),
            options: vec![],
        };
        w.write_pcapng_block(epb).unwrap();
    }
    drop(w);
    out
}

/// Runs roce-dump on `bytes`; checks the exit-status rule and returns (status, stdout, stderr).
#[track_caller]
fn dump(bytes: &[u8], path: &Path, what: &str) -> (i32, String, String) {
    std::fs::write(path, bytes).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_roce-dump")).arg(path).output().expect("run roce-dump");
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    let code = o.status.code().unwrap_or_else(|| panic!("{what}: killed by a signal: {err}"));
    match code {
        0 | 1 => {
            let last = out.lines().last().unwrap_or_default();
            assert!(last.starts_with("frames="), "{what}: no summary line: {out}");
            // Only the lines naming frames of a link type that is not decoded (one per link type).
            let note = format!("roce-dump: {}: ", path.display());
            assert!(
                err.lines().all(
                    |l| l.starts_with(&note) && l.ends_with(" not decoded (Ethernet, Linux cooked and raw IP are)")
                ),
                "{what}: {err}"
            );
        }
        2 => {
            assert_eq!(err.lines().count(), 1, "{what}: {err}");
            assert!(err.starts_with(&format!("roce-dump: {}: ", path.display())), "{what}: {err}");
        }
        c => panic!("{what}: exit {c}: {err}"),
    }
    (code, out, err)
}

#[test]
fn mutated_and_truncated_captures_follow_the_exit_rule() {
    let pcap = capture();
    let pcapng = as_pcapng(&pcap);
    let path = temp("mutated");
    let mut rng = SimRng::new(0x0d0e_5eed);
    for (name, src) in [("pcap", &pcap), ("pcapng", &pcapng)] {
        let (code, out, _) = dump(src, &path, name);
        assert_eq!((code, out.lines().last()), (0, Some("frames=78 roce=40 icrc_ok=40 icrc_bad=0 malformed=0")));
        for i in 0..150 {
            let mut d = src.clone();
            if i % 3 == 0 {
                d.truncate(rng.below(d.len() as u64) as usize);
            }
            if !d.is_empty() {
                for _ in 0..=rng.below(12) {
                    let at = rng.below(d.len() as u64) as usize;
                    d[at] = rng.next_u64() as u8;
                }
            }
            dump(&d, &path, &format!("{name} mutation {i}"));
        }
    }
    let _ = std::fs::remove_file(path);
}

/// Length fields that claim gigabytes (a pcap record's captured length, a pcapng block's total length and an
/// enhanced packet's captured length) in a file of a few hundred bytes: exit 2, "corrupt" or "truncated", at once;
/// a pcapng packet naming an interface the file never described is counted as a frame that is not decoded, and
/// said so on stderr.
#[test]
fn length_fields_claiming_gigabytes_are_truncated_files() {
    let path = temp("huge");
    let mut pcap = capture();
    pcap[24 + 8..24 + 16].copy_from_slice(&[0xf0, 0xff, 0xff, 0xff, 0xf0, 0xff, 0xff, 0xff]);
    let (code, _, err) = dump(&pcap, &path, "pcap incl_len 2^32 - 16");
    assert_eq!(code, 2);
    assert!(err.contains("corrupt capture file: record 1 claims 4294967280 captured bytes"), "{err}");

    let shb: Vec<u8> = [
        &0x0a0d_0d0au32.to_le_bytes()[..],
        &28u32.to_le_bytes(),
        &0x1a2b_3c4du32.to_le_bytes(),
        &1u16.to_le_bytes(),
        &0u16.to_le_bytes(),
        &(-1i64).to_le_bytes(),
        &28u32.to_le_bytes(),
    ]
    .concat();
    let idb: Vec<u8> =
        [&1u32.to_le_bytes()[..], &20u32.to_le_bytes(), &[1, 0, 0, 0], &0u32.to_le_bytes(), &20u32.to_le_bytes()]
            .concat();
    let epb = |iface: u32, caplen: u32| -> Vec<u8> {
        let total = 28u32 + 60 + 4;
        let mut b = Vec::new();
        for v in [6, total, iface, 0, 0, caplen, 60] {
            b.extend_from_slice(&u32::to_le_bytes(v));
        }
        b.extend_from_slice(&[0; 60]);
        b.extend_from_slice(&total.to_le_bytes());
        b
    };
    let huge_block: Vec<u8> = [&6u32.to_le_bytes()[..], &0xffff_fff0u32.to_le_bytes(), &[0; 64]].concat();
    for (what, file) in [
        ("pcapng block of 2^32 - 16 bytes", [&shb[..], &huge_block].concat()),
        ("pcapng packet of 2^32 - 256 captured bytes", [&shb[..], &idb, &epb(0, 0xffff_ff00)].concat()),
    ] {
        let (code, _, err) = dump(&file, &path, what);
        assert_eq!(code, 2, "{what}");
        assert!(err.contains("truncated") || err.contains("corrupt"), "{what}: {err}");
    }
    let (code, out, err) = dump(&[&shb[..], &idb, &epb(7, 60)].concat(), &path, "packet of interface 7");
    assert_eq!((code, out.lines().last()), (0, Some("frames=1 roce=0 icrc_ok=0 icrc_bad=0 malformed=0")));
    assert!(err.contains(": 1 frames of interfaces the file never described not decoded"), "{err}");
    let _ = std::fs::remove_file(path);
}

// ============================================================================ session 10: rdp-client's out-of-band peer
//
// The other rdp-client is not trusted (README, threat model: hostile input never panics a tool, hangs it or grows
// it without bound). A hostile active side against a real passive one (on an in-process loopback daemon): an endless
// line, a length past the message slot, and silence. Each gives one line and exit 2; before, the endless line grew
// the passive's memory for as long as it was fed, the length panicked it (exit 101) and silence blocked it for ever.

mod oob_peer {
    use roce_dp::ctrl::loopback::{LoopbackConfig, LoopbackDaemon};
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("rdp-client-audit-{}-{name}", std::process::id()))
    }

    /// A passive rdp-client with `--timeout timeout` on its own loopback daemon, and a connection to its
    /// out-of-band socket that has read its QP line.
    fn passive(tag: &str, timeout: u32) -> (LoopbackDaemon, Child, UnixStream, String) {
        let sock = temp(&format!("{tag}-daemon.sock"));
        let oob = temp(&format!("{tag}-oob.sock"));
        let d = LoopbackDaemon::start(LoopbackConfig::new(&sock)).expect("loopback daemon starts");
        let child = Command::new(env!("CARGO_BIN_EXE_rdp-client"))
            .args(["passive", "--daemon", sock.to_str().unwrap(), "--oob", oob.to_str().unwrap()])
            .args(["--timeout", &timeout.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rdp-client passive");
        let until = Instant::now() + Duration::from_secs(20);
        let s = loop {
            match UnixStream::connect(&oob) {
                Ok(s) => break s,
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("the passive side never listened on {}: {e}", oob.display()),
            }
        };
        let mut line = String::new();
        BufReader::new(s.try_clone().unwrap()).read_line(&mut line).unwrap();
        assert!(line.starts_with("QP "), "{line:?}");
        (d, child, s, line)
    }

    /// Waits at most `secs` for the child; kills it (and fails) if it is still running.
    fn finish(child: Child, secs: u64, what: &str) -> (Option<i32>, String) {
        let o = crate::common::wait_child(child, secs, what);
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    }

    #[test]
    fn an_endless_line_is_refused_at_the_line_limit() {
        let (d, child, s, _) = passive("endless", 60);
        // 8 MiB without a newline, from a thread (the passive stops reading at its limit); the connection stays open.
        let mut w = s.try_clone().unwrap();
        let feeder = std::thread::spawn(move || {
            let chunk = vec![b'A'; 64 << 10];
            for _ in 0..128 {
                if w.write_all(&chunk).is_err() {
                    break;
                }
            }
        });
        let (code, err) = finish(child, 20, "endless line");
        assert_eq!(
            (code, err.as_str()),
            (Some(2), "rdp-client: out-of-band: a line longer than 1024 bytes from the other client\n")
        );
        let _ = s.shutdown(std::net::Shutdown::Both);
        feeder.join().unwrap();
        drop(d);
    }

    #[test]
    fn a_length_past_the_message_slot_is_refused() {
        for cmd in ["CHECK 1 99999999999", "CHECKRECV 1 1048577", "FILL 1 18446744073709551615", "RECV 1 4294967296"] {
            let (d, child, mut s, mine) = passive("length", 60);
            // Our QP line: the passive's own GID (the same daemon), any QPN.
            let gid = mine.split_whitespace().nth(3).unwrap();
            writeln!(s, "QP 1 0 {gid} 0 0").unwrap();
            writeln!(s, "{cmd}").unwrap();
            let (code, err) = finish(child, 20, cmd);
            assert_eq!(code, Some(2), "{cmd}: {err}");
            assert_eq!(err.lines().count(), 1, "{cmd}: {err}");
            assert!(
                err.starts_with("rdp-client: out-of-band: length ") && err.contains("message slot"),
                "{cmd}: {err}"
            );
            drop(d);
        }
    }

    #[test]
    fn a_silent_peer_ends_at_the_timeout() {
        let (d, child, s, _) = passive("silent", 2);
        let (code, err) = finish(child, 20, "silent peer");
        assert_eq!(
            (code, err.as_str()),
            (Some(2), "rdp-client: out-of-band: the other client sent or took nothing within --timeout 2 s\n")
        );
        drop(s);
        drop(d);
    }
}

// ============================================================================ session 11: captures as users take them
//
// roce-dump on what tcpdump, dumpcap and Wireshark users hand it: a snapshot length (`tcpdump -s 160`, the
// project's own `IOP_PCAP=1` matrix captures take `-s 160`), `tcpdump -i any` (Linux cooked SLL / SLL2), raw IP, and a
// pcapng with an interface of a link type nobody decodes. Before: a pcap with a snapshot length ended at its first
// cut record with exit 2 ("PacketHeader orig_len > snap_len", pcap-file's check; Wireshark reads such files), a
// pcapng's cut frames were all MALFORMED "truncated frame" (exit 1), Linux cooked and raw IP captures were refused
// ("unsupported link type"), and a pcapng interface of another link type was counted without a word.
mod captures {
    use super::{capture, dump, temp};
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapReader, PcapWriter};
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::DataLink;
    use std::borrow::Cow;
    use std::path::Path;
    use std::process::Command;
    use std::time::Duration;

    const CAPTURES: [&str; 4] = ["rc_write_4k.pcap", "rc_read_4k.pcap", "rc_send_lat_64.pcap", "ud_send_1k.pcap"];

    fn frames(name: &str) -> Vec<(Duration, Vec<u8>)> {
        let p = format!("{}/../roce-dp/tests/vectors/rxe/{name}", env!("CARGO_MANIFEST_DIR"));
        let bytes = std::fs::read(p).unwrap();
        let mut r = PcapReader::new(bytes.as_slice()).unwrap();
        let mut v = Vec::new();
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            v.push((p.timestamp, p.data.into_owned()));
        }
        v
    }

    /// A pcap of `link` with snapshot length `snap`: each record keeps at most `snap` bytes of `frames` (after
    /// `wrap` turned each Ethernet frame into a frame of that link type) and records its whole length, as tcpdump
    /// writes.
    fn write(path: &Path, link: DataLink, snap: u32, frames: &[(Duration, Vec<u8>)], wrap: impl Fn(&[u8]) -> Vec<u8>) {
        let header = PcapHeader { datalink: link, snaplen: snap, ..Default::default() };
        let mut w = PcapWriter::with_header(std::fs::File::create(path).unwrap(), header).unwrap();
        for (t, d) in frames {
            let d = wrap(d);
            let keep = d.len().min(snap as usize);
            w.write_packet(&PcapPacket::new(*t, d.len() as u32, &d[..keep])).unwrap();
        }
    }

    fn json_lines(path: &Path) -> (i32, Vec<String>) {
        let o = Command::new(env!("CARGO_BIN_EXE_roce-dump")).arg("--json").arg(path).output().unwrap();
        let out = String::from_utf8(o.stdout).unwrap();
        (o.status.code().unwrap_or(-1), out.lines().map(str::to_owned).collect())
    }

    /// `"key":value` of a JSON line, as text (the last of that name: the payload's `len`, not the RETH's).
    fn field<'a>(line: &'a str, key: &str) -> &'a str {
        let at = line.rfind(&format!("\"{key}\":")).unwrap_or_else(|| panic!("{key} in {line}")) + key.len() + 3;
        let rest = &line[at..];
        &rest[..rest.find([',', '}']).unwrap()]
    }

    /// Every vendored capture cut at snapshot lengths from inside the BTH to past the longest frame: each RoCE
    /// frame whose headers were captured decodes to the line of the whole capture with `"icrc_ok":null` and its
    /// `caplen`; one whose headers were cut is a SNAPPED line; one not cut is unchanged. Exit 0, `snapped=N` in
    /// the summary. Wireshark is the oracle that the fixture is a capture it reads, and that the PSNs decoded at
    /// `-s 160` are its own.
    #[test]
    fn snapshot_lengths_decode_the_captured_headers() {
        let path = temp("snap.pcap");
        for name in CAPTURES {
            let f = frames(name);
            write(&path, DataLink::ETHERNET, 65535, &f, <[u8]>::to_vec);
            let (code, whole) = json_lines(&path);
            assert_eq!(code, 0, "{name}");
            // A header whose snapshot length is below its records' captured lengths (some writers store one):
            // Wireshark reads the records as captured, and so does roce-dump (pcap-file refused them).
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[16..20].copy_from_slice(&64u32.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(json_lines(&path), (0, whole.clone()), "{name} with a snapshot length of 64 in its header");
            // The RoCE frames in order, with their JSON line.
            let roce: Vec<(&Vec<u8>, &String)> = f
                .iter()
                .filter(|(_, d)| d.len() > 42 && d[36..38] == [0x12, 0xb7])
                .map(|(_, d)| d)
                .zip(&whole[..whole.len() - 1])
                .collect();
            assert_eq!(roce.len(), whole.len() - 1, "{name}");
            for snap in [50u32, 54, 58, 62, 70, 74, 100, 160, 1100] {
                write(&path, DataLink::ETHERNET, snap, &f, <[u8]>::to_vec);
                let what = format!("{name} -s {snap}");
                let (code, lines) = json_lines(&path);
                assert_eq!(code, 0, "{what}: {lines:?}");
                assert_eq!(lines.len(), whole.len(), "{what}");
                let mut cut_frames = 0;
                for ((d, full), got) in roce.iter().zip(&lines) {
                    let (len, pad): (usize, usize) =
                        (field(full, "len").parse().unwrap(), field(full, "pad").parse().unwrap());
                    let headers = d.len() - len - pad - 4;
                    if d.len() <= snap as usize {
                        assert_eq!(got, *full, "{what}");
                    } else if headers <= snap as usize {
                        cut_frames += 1;
                        let want = full.replace("\"icrc_ok\":true", &format!("\"icrc_ok\":null,\"caplen\":{snap}"));
                        assert_eq!(got, &want, "{what}");
                    } else {
                        cut_frames += 1;
                        assert!(
                            got.contains(&format!(
                                "\"snapped\":\"the capture cut the RoCE headers\",\"caplen\":{snap},\"len\":{}}}",
                                d.len()
                            )),
                            "{what}: {got}"
                        );
                    }
                }
                let ok = roce.len() - cut_frames;
                let summary = format!(
                    "frames={} roce={} icrc_ok={ok} icrc_bad=0 malformed=0{}",
                    f.len(),
                    roce.len(),
                    if cut_frames > 0 { format!(" snapped={cut_frames}") } else { String::new() }
                );
                assert_eq!(lines.last(), Some(&summary), "{what}");
                if snap == 160 {
                    // Verbose: the stored ICRC of a cut frame is not shown as a value it never had.
                    let o = Command::new(env!("CARGO_BIN_EXE_roce-dump"))
                        .args(["--json", "-v"])
                        .arg(&path)
                        .output()
                        .unwrap();
                    let v = String::from_utf8(o.stdout).unwrap();
                    for (got, (d, _)) in v.lines().zip(&roce) {
                        let stored = field(got, "icrc");
                        assert_eq!(stored == "null", d.len() > 160, "{what}: {got}");
                    }
                    let o = Command::new("tshark")
                        .arg("-r")
                        .arg(&path)
                        .args(["-Y", "infiniband", "-T", "fields", "-e", "infiniband.bth.psn"])
                        .output()
                        .expect("run tshark (install it: scripts/setup.sh)");
                    assert!(o.status.success(), "{what}: tshark: {}", String::from_utf8_lossy(&o.stderr));
                    let theirs: Vec<String> = String::from_utf8(o.stdout).unwrap().lines().map(str::to_owned).collect();
                    let ours: Vec<String> =
                        lines[..lines.len() - 1].iter().map(|l| field(l, "psn").to_owned()).collect();
                    assert_eq!(ours, theirs, "{what}: PSNs as Wireshark decodes them");
                }
            }
        }
        let _ = std::fs::remove_file(path);
    }

    /// An Ethernet frame as a Linux cooked (SLL) frame: packet type "sent by us", ARPHRD_ETHER, the source MAC.
    fn sll(d: &[u8]) -> Vec<u8> {
        [&[0, 4, 0, 1, 0, 6][..], &d[6..12], &[0, 0], &d[12..14], &d[14..]].concat()
    }

    /// The same as SLL2: protocol, reserved, interface index 2, ARPHRD_ETHER, packet type, address length, MAC.
    fn sll2(d: &[u8]) -> Vec<u8> {
        [&d[12..14], &[0, 0, 0, 0, 0, 2, 0, 1, 4, 6][..], &d[6..12], &[0, 0], &d[14..]].concat()
    }

    /// `tcpdump -i any` (SLL and SLL2) and raw IP captures of the vendored frames print the lines the Ethernet
    /// capture prints (the text lines carry no MAC), frame for frame, with the same summary; Wireshark decodes as
    /// many RoCE frames in each fixture.
    #[test]
    fn linux_cooked_and_raw_ip_captures_decode_as_ethernet() {
        let path = temp("link.pcap");
        for name in CAPTURES {
            let f = frames(name);
            write(&path, DataLink::ETHERNET, 65535, &f, <[u8]>::to_vec);
            let (_, want, _) = dump(&std::fs::read(&path).unwrap(), &path, name);
            for (link, wrap) in [
                (DataLink::LINUX_SLL, sll as fn(&[u8]) -> Vec<u8>),
                (DataLink::LINUX_SLL2, sll2),
                (DataLink::RAW, |d: &[u8]| d[14..].to_vec()),
                (DataLink::IPV4, |d: &[u8]| d[14..].to_vec()),
            ] {
                write(&path, link, 65535, &f, wrap);
                let what = format!("{name} as {link:?}");
                let (code, out, _) = dump(&std::fs::read(&path).unwrap(), &path, &what);
                assert_eq!((code, &out), (0, &want), "{what}");
                let o = Command::new("tshark").arg("-r").arg(&path).args(["-Y", "infiniband"]).output().unwrap();
                let theirs = String::from_utf8(o.stdout).unwrap().lines().count();
                assert_eq!(theirs, want.lines().count() - 1, "{what}: RoCE frames as Wireshark decodes them");
            }
        }
        // A frame shorter than its Linux cooked header is a truncated RoCE frame, not a panic.
        write(&path, DataLink::LINUX_SLL, 65535, &[(Duration::ZERO, vec![0; 20])], |d| d[..10].to_vec());
        let (code, out, _) = dump(&std::fs::read(&path).unwrap(), &path, "short SLL");
        assert_eq!(code, 1, "{out}");
        assert!(out.contains("MALFORMED frame=1 reason=\"truncated frame\""), "{out}");
        let _ = std::fs::remove_file(path);
    }

    /// A pcapng with an Ethernet interface and an 802.11 one: the Ethernet frames decode, and one line on stderr
    /// names the link type and the frames of it that were counted but not decoded.
    #[test]
    fn a_pcapng_interface_of_another_link_type_is_named() {
        let path = temp("mixed.pcapng");
        let pcap = capture();
        let mut r = PcapReader::new(pcap.as_slice()).unwrap();
        let mut out = Vec::new();
        let mut w = PcapNgWriter::new(&mut out).unwrap();
        for link in [DataLink::ETHERNET, DataLink::IEEE802_11] {
            w.write_pcapng_block(InterfaceDescriptionBlock { linktype: link, snaplen: 0, options: vec![] }).unwrap();
        }
        let mut n = 0;
        while let Some(p) = r.next_packet() {
            let p = p.unwrap();
            for iface in [0, 1] {
                let data = Cow::Owned(p.data.to_vec());
                let epb = EnhancedPacketBlock {
                    interface_id: iface,
                    timestamp: p.timestamp,
                    original_len: p.orig_len,
                    data,
                    options: vec![],
                };
                w.write_pcapng_block(epb).unwrap();
            }
            n += 1;
        }
        drop(w);
        let (code, stdout, err) = dump(&out, &path, "mixed pcapng");
        assert_eq!(code, 0);
        assert_eq!(
            stdout.lines().last(),
            Some(format!("frames={} roce=40 icrc_ok=40 icrc_bad=0 malformed=0", 2 * n).as_str())
        );
        assert_eq!(
            err,
            format!("roce-dump: {}: {n} frames of link type IEEE802_11 not decoded (Ethernet, Linux cooked and raw IP are)\n", path.display())
        );
        let _ = std::fs::remove_file(path);
    }
}
