//! Session 9's audit of the tools' inputs from files: roce-dump on pcap and pcapng captures that are cut short,
//! mutated byte by byte, or claim records of gigabytes. The rule (README, tools): exit 0 or 1 with the summary line
//! when the file reads, exit 2 with exactly one line `roce-dump: FILE: reason` when it does not; never a panic, never
//! an allocation of what a length field claims.

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
            assert!(err.is_empty(), "{what}: {err}");
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
/// enhanced packet's captured length) in a file of a few hundred bytes: exit 2, "truncated", at once; a pcapng
/// packet naming an interface the file never described is counted as a frame that is not Ethernet.
#[test]
fn length_fields_claiming_gigabytes_are_truncated_files() {
    let path = temp("huge");
    let mut pcap = capture();
    pcap[24 + 8..24 + 16].copy_from_slice(&[0xf0, 0xff, 0xff, 0xff, 0xf0, 0xff, 0xff, 0xff]);
    let (code, _, err) = dump(&pcap, &path, "pcap incl_len 2^32 - 16");
    assert_eq!(code, 2);
    assert!(err.contains("truncated"), "{err}");

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
    let (code, out, _) = dump(&[&shb[..], &idb, &epb(7, 60)].concat(), &path, "packet of interface 7");
    assert_eq!((code, out.lines().last()), (0, Some("frames=1 roce=0 icrc_ok=0 icrc_bad=0 malformed=0")));
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
    fn finish(mut child: Child, secs: u64, what: &str) -> (Option<i32>, String) {
        let until = Instant::now() + Duration::from_secs(secs);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > until {
                child.kill().unwrap();
                let o = child.wait_with_output().unwrap();
                panic!("{what}: the passive side still runs after {secs} s: {}", String::from_utf8_lossy(&o.stderr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
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
