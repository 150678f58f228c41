//! DCQCN from the tools' side: a CNP the engine builds decodes in tshark as an RRoCE CNP and verifies with
//! roce-dump; the TOML configuration (every parameter, unknown keys rejected); `rdp-sim --incast`.

use pcap_file::pcap::{PcapPacket, PcapWriter};
use roce_dp::engine::MAX_HEADER_BYTES;
use roce_dp::sim::incast::{connect, mark_ce};
use roce_dp::wire::{self, IpAddrs, MacAddr, Opcode};
use roce_dp::{
    AccessFlags, CcAlgorithm, CcConfig, DcqcnConfig, Engine, EngineConfig, Instant, LocalIp, PeerAddr, QpCaps, RxMeta,
    SendWr, Sge, WrOpcode,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dp-dcqcn-test-{}-{name}", std::process::id()))
}

fn repo() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A WRITE frame from engine 0 marked CE by "a switch", handed to engine 1, which answers with a CNP first.
/// Returns (data frame, CNP frame, QP number of engine 0).
fn engine_cnp() -> (Vec<u8>, Vec<u8>, u32) {
    let ip = [[192, 168, 7, 1], [192, 168, 7, 2]];
    let mac = [MacAddr([2, 0, 0, 0, 7, 1]), MacAddr([2, 0, 0, 0, 7, 2])];
    let mut e: Vec<Engine> = (0..2)
        .map(|n| {
            Engine::new(EngineConfig {
                local_mac: mac[n],
                local_ip: LocalIp { v4: Some(ip[n]), v6: None },
                qpn_base: 0x11 + n as u32 * 0x100,
                ..EngineConfig::default()
            })
        })
        .collect();
    let mut qpn = [0; 2];
    let mut keys = Vec::new();
    for n in 0..2 {
        let pd = e[n].alloc_pd();
        let cq = e[n].create_cq(16).unwrap();
        keys.push(e[n].reg_mr(pd, 0x1000, 4096, AccessFlags::ALL).unwrap());
        qpn[n] = e[n].create_qp(pd, cq, cq, QpCaps::default()).unwrap();
    }
    for n in 0..2 {
        let peer = PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: ip[1 - n] }, mac: mac[1 - n] };
        connect(&mut e[n], qpn[n], qpn[1 - n], peer, 1024).unwrap();
    }
    let wr = SendWr::new(1, WrOpcode::RdmaWrite).remote(0x1000, keys[1].rkey);
    e[0].post_send(qpn[0], &wr, &[Sge { addr: 0x1000, len: 512, lkey: keys[0].lkey }]).unwrap();
    let mut buf = vec![0u8; 4096 + MAX_HEADER_BYTES];
    let n = e[0].poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let mut data = buf[..n].to_vec();
    assert!(mark_ce(&mut data));
    e[1].handle_rx(Instant::from_micros(1), &data, RxMeta::default());
    let n = e[1].poll_transmit(Instant::from_micros(1), &mut buf).unwrap();
    let cnp = buf[..n].to_vec();
    assert_eq!(wire::parse_frame(&cnp).unwrap().repr.bth.opcode, Opcode::CNP);
    (data, cnp, qpn[0])
}

fn write_pcap(path: &Path, frames: &[&[u8]]) {
    let mut w = PcapWriter::new(std::fs::File::create(path).unwrap()).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(&PcapPacket::new(Duration::from_micros(i as u64), f.len() as u32, f)).unwrap();
    }
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn an_engine_cnp_decodes_in_tshark_as_rroce_cnp_and_verifies_with_roce_dump() {
    let (data, cnp, qpn) = engine_cnp();
    let path = temp("cnp.pcap");
    write_pcap(&path, &[&data, &cnp]);
    // tshark must be installed (scripts/setup.sh): a missing tshark fails this test rather than skipping it.
    // No Wireshark that Debian packages names the RoCEv2 CNP opcode 0x81 (bookworm 4.0.17, trixie 4.4.18, sid
    // 4.6.9: their opcode table names only 0x80, the InfiniBand CNP of Annex A10, and bookworm-backports has no
    // Wireshark), and none dissects FECN/BECN: the BTH byte after the P_Key is one "Reserved" field. So this
    // checks what tshark does decode: RRoCE, opcode 129, P_Key, that byte (0x40 = BECN alone), dest QP, PSN,
    // AckReq, DSCP, ECN and the 16 reserved bytes plus the ICRC as vendor data; and that the opcode's name, if
    // tshark has one, is CNP.
    let fields = [
        "_ws.col.Protocol",
        "infiniband.bth.opcode",
        "infiniband.bth.p_key",
        "infiniband.reserved",
        "infiniband.bth.destqp",
    ];
    let more = ["infiniband.bth.psn", "infiniband.bth.a", "ip.dsfield.dscp", "ip.dsfield.ecn", "infiniband.vendor"];
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(&path).args(["-T", "fields", "-E", "separator=,"]);
    for f in fields.iter().chain(more.iter()) {
        cmd.args(["-e", f]);
    }
    let o = cmd.output().expect("run tshark (install it: scripts/setup.sh)");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "tshark failed:\n{}", text(&o));
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 2, "{out}");
    // The CE-marked WRITE ONLY: neither FECN nor BECN.
    assert!(rows[0].starts_with("RRoCE,10,65535,00,"), "the CE-marked WRITE ONLY: {}", rows[0]);
    // CNP: RoCEv2, opcode 129, P_Key 0xffff, BECN set and nothing else in its byte, dest QP = the QP that sent the
    // marked frame, PSN 0, no AckReq, DSCP 48, Not-ECT, then 16 zero bytes and 4 ICRC bytes.
    let want = format!("RRoCE,129,65535,40,0x{qpn:06x},0,0,48,0,");
    assert!(rows[1].starts_with(&want), "CNP decode:\n{}\nwant prefix {want}", rows[1]);
    let tail = rows[1].rsplit(',').next().unwrap();
    assert!(tail.len() == 40 && tail.starts_with(&"0".repeat(32)), "16 zero bytes + ICRC: {}", rows[1]);
    // The opcode's name in the detail view: "Unknown (129)" today; a Wireshark that learns 0x81 must call it CNP.
    let o = Command::new("tshark").arg("-r").arg(&path).args(["-V", "-Y", "infiniband.bth.opcode == 129"]).output();
    let o = o.expect("run tshark -V");
    let detail = String::from_utf8_lossy(&o.stdout).to_string();
    let op = detail.lines().map(str::trim).find(|l| l.starts_with("Opcode:")).unwrap_or_else(|| panic!("{detail}"));
    let name = op.trim_start_matches("Opcode:").trim().trim_end_matches("(129)").trim();
    assert!(op.ends_with("(129)") && (name == "Unknown" || name.contains("CNP")), "opcode line: {op}");
    // roce-dump parses both frames and verifies their ICRC.
    let o = Command::new(env!("CARGO_BIN_EXE_roce-dump")).arg(&path).output().expect("run roce-dump");
    let out = text(&o);
    assert!(o.status.success(), "roce-dump failed:\n{out}");
    let cnp_line = out.lines().find(|l| l.contains(" CNP ")).unwrap_or_else(|| panic!("no CNP line:\n{out}"));
    assert!(cnp_line.contains("becn=1") && cnp_line.contains("icrc=ok"), "{cnp_line}");
    assert!(out.contains("icrc_ok=2 icrc_bad=0 malformed=0"), "{out}");
    let _ = std::fs::remove_file(&path);
}

/// Field names of a struct from its Debug output at the outermost level ("Name { a: 1, b: Inner { .. } }").
fn debug_fields(dbg: &str) -> BTreeSet<String> {
    let body = &dbg[dbg.find('{').unwrap() + 1..dbg.rfind('}').unwrap()];
    let (mut depth, mut names, mut cur) = (0, BTreeSet::new(), String::new());
    for ch in body.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ':' if depth == 0 && !cur.trim().is_empty() => {
                names.insert(cur.trim().to_string());
                cur.clear();
            }
            ',' if depth == 0 => cur.clear(),
            _ if depth == 0 => cur.push(ch),
            _ => {}
        }
    }
    names
}

#[test]
fn the_toml_example_sets_every_parameter_to_the_connectx_defaults() {
    let text = std::fs::read_to_string(repo().join("conf/dcqcn.toml")).expect("conf/dcqcn.toml");
    let table: toml::Table = toml::from_str(&text).unwrap();
    let top: BTreeSet<String> = table.keys().cloned().collect();
    assert_eq!(top, debug_fields(&format!("{:?}", CcConfig::default())));
    let dcqcn: BTreeSet<String> = table["dcqcn"].as_table().unwrap().keys().cloned().collect();
    let want = debug_fields(&format!("{:?}", DcqcnConfig::default()));
    assert_eq!(want.len(), 19);
    assert_eq!(dcqcn, want, "conf/dcqcn.toml must set every DCQCN parameter");
    let cfg: CcConfig = toml::from_str(&text).unwrap();
    assert_eq!(cfg, CcConfig { algorithm: CcAlgorithm::Dcqcn, ..CcConfig::default() });
    cfg.validate().unwrap();
    // And a file that changes values is read as written.
    let cfg: CcConfig =
        toml::from_str("algorithm = \"line_rate\"\n[dcqcn]\nrp_time_reset = 55\nnp_cnp_dscp = 26\n").unwrap();
    assert_eq!(cfg.algorithm, CcAlgorithm::LineRate);
    assert_eq!((cfg.dcqcn.rp_time_reset, cfg.dcqcn.np_cnp_dscp, cfg.dcqcn.rp_ai_rate), (55, 26, 5));
}

fn rdp_sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdp-sim")).args(args).output().expect("run rdp-sim")
}

#[test]
fn unknown_or_bad_toml_keys_are_clear_errors() {
    let e = toml::from_str::<CcConfig>("[dcqcn]\nrp_time_rest = 300\n").unwrap_err().to_string();
    assert!(e.contains("unknown field `rp_time_rest`") && e.contains("rp_time_reset"), "{e}");
    let e = toml::from_str::<CcConfig>("alpha = 1\n").unwrap_err().to_string();
    assert!(e.contains("unknown field `alpha`"), "{e}");
    let path = temp("bad.toml");
    std::fs::write(&path, "[dcqcn]\nrp_time_rest = 300\n").unwrap();
    let o = rdp_sim(&["--incast", "2", "--duration-ms", "0.1", "--cc-config", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("unknown field `rp_time_rest`"), "{}", text(&o));
    std::fs::write(&path, "[dcqcn]\nrp_gd = 3\n").unwrap();
    let o = rdp_sim(&["--incast", "2", "--duration-ms", "0.1", "--cc-config", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("rp_gd = 3 is outside 10..=20"), "{}", text(&o));
    // rp_byte_reset is a 15-bit count of 64-byte units, as in the ConnectX firmware.
    std::fs::write(&path, "[dcqcn]\nrp_byte_reset = 32768\n").unwrap();
    let o = rdp_sim(&["--incast", "2", "--duration-ms", "0.1", "--cc-config", path.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("rp_byte_reset = 32768 is outside 0..=32767"), "{}", text(&o));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn rdp_sim_incast_prints_per_flow_results_and_writes_trace_and_plot() {
    let (csv, svg) = (temp("trace.csv"), temp("plot.svg"));
    let conf = repo().join("conf/dcqcn.toml");
    let o = rdp_sim(&[
        "--incast",
        "4",
        "--link-gbps",
        "25",
        "--duration-ms",
        "1",
        "--dcqcn",
        "on",
        "--cc-config",
        conf.to_str().unwrap(),
        "--trace",
        csv.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let last = String::from_utf8_lossy(&o.stdout).lines().last().unwrap().to_string();
    let f: Vec<&str> = last.split(' ').collect();
    assert_eq!(f.len(), 8, "{last}");
    let keys: Vec<&str> = f[1..].iter().map(|kv| kv.split('=').next().unwrap()).collect();
    assert_eq!(keys, ["status", "flows", "jain", "util", "max_queue_kb", "cnps", "drops"], "{last}");
    assert!(last.starts_with("result: status=ok flows=4 jain="), "{last}");
    for kv in &f[3..] {
        kv.split('=').nth(1).unwrap().parse::<f64>().unwrap_or_else(|_| panic!("{kv} in {last}"));
    }
    assert_eq!(out.lines().filter(|l| l.starts_with("flow ")).count(), 4, "{out}");
    // The file's parameters were used (ConnectX T = 300 us), not the default preset (60 us).
    assert!(out.contains("rp_time_reset: 300"), "{out}");
    let trace = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(trace.lines().next(), Some(roce_dp_tools::incast::TRACE_HEADER));
    // 1 ms at a 10 us sample period: 101 samples of 4 flows.
    assert_eq!(trace.lines().count(), 1 + 101 * 4);
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.matches("<polyline").count() == 5);
    for p in [csv, svg] {
        let _ = std::fs::remove_file(p);
    }
    // Same arguments and seed in another process: the same trace, byte for byte.
    let again = temp("trace2.csv");
    let o = rdp_sim(&[
        "--incast",
        "4",
        "--duration-ms",
        "1",
        "--cc-config",
        conf.to_str().unwrap(),
        "--trace",
        again.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&again).unwrap(), trace, "two runs, two traces");
    let _ = std::fs::remove_file(again);
    // DCQCN off prints the same line shape; bad arguments exit 2.
    let o = rdp_sim(&["--incast", "2", "--duration-ms", "0.5", "--dcqcn", "off"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).lines().last().unwrap().starts_with("result: status=ok flows=2 "));
    assert_eq!(rdp_sim(&["--incast", "0"]).status.code(), Some(2));
    assert_eq!(rdp_sim(&["--incast", "2", "--pmax", "2"]).status.code(), Some(2));
}
