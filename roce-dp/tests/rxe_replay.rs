//! The RC engine against real bytes: the Linux rxe captures in ../shared/vectors/rxe (perftest runs between two
//! rxe guests, an independent implementation).
//!
//! For each rc_*.pcap the engine plays one side of the connection (the perftest server, then the client) with that
//! side's QPN, PSN, rkey and buffer address from perftest's exchange records (decoded from the TCP payloads in the
//! capture), the MACs and IPs of the frames, and the path MTU of the .perftest.txt. The other side's frames are fed
//! to it at their capture timestamps; the work requests of the played side (derived from its own request frames in
//! the capture, checked against the perftest command line) are posted at the time its first packet left. Every
//! frame the engine sends must equal the played side's frame in the capture byte for byte, except the IPv4
//! identification: the engine's frame gets the capture's ID, its IPv4 checksum and ICRC (which covers the ID) are
//! recomputed, and then every byte is compared. Completions (status, count, order, lengths) and the data placed in
//! memory (WRITE targets, received SENDs, READ results, atomic original values) are checked as well.
//!
//! Memory the capture shows but nothing in it writes (the server's buffer that READs and atomics read) is loaded
//! from the first response that reveals it; every later response reading the same bytes is a real check, and so
//! are all headers.

mod common;
mod harness;

use harness::{summary, with_ip_id};
use roce_dp::wire::{op, parse_frame, Opcode, RoceFrame};
use roce_dp::{
    AccessFlags, CqId, Cqe, Engine, EngineConfig, Instant, LocalIp, MrKeys, PeerAddr, QpAttr, QpCaps, QpState, RxMeta,
    SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};
use std::fmt::Write as _;

// ---------------------------------------------------------------------------------------------------- the capture

/// One perftest exchange record: `LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID(16 x %02x):SRQN:` + NUL (108 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    out_reads: u32,
    qpn: u32,
    psn: u32,
    rkey: u32,
    vaddr: u64,
    /// The IPv4 address in the IPv4-mapped GID.
    ip: [u8; 4],
}

fn parse_record(b: &[u8]) -> Option<Record> {
    if b.len() != 108 || b[107] != 0 {
        return None;
    }
    let s = std::str::from_utf8(&b[..107]).ok()?;
    let f: Vec<&str> = s.split(':').collect();
    if f.len() != 24 || !f[23].is_empty() {
        return None;
    }
    let hex = |i: usize| u64::from_str_radix(f[i], 16).ok();
    let gid: Vec<u8> = (6..22).map(|i| u8::from_str_radix(f[i], 16).ok()).collect::<Option<_>>()?;
    if gid[..12] != [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        return None;
    }
    Some(Record {
        out_reads: hex(1)? as u32,
        qpn: hex(2)? as u32,
        psn: hex(3)? as u32,
        rkey: hex(4)? as u32,
        vaddr: hex(5)?,
        ip: [gid[12], gid[13], gid[14], gid[15]],
    })
}

/// The TCP payload of an untagged IPv4 frame and whether it goes to perftest's server port 18515.
fn tcp_payload(f: &[u8]) -> Option<(&[u8], bool)> {
    if f.len() < 34 || f[12..14] != [0x08, 0x00] || f[23] != 6 {
        return None;
    }
    let ihl = usize::from(f[14] & 0xf) * 4;
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let tcp = f.get(14 + ihl..14 + total)?;
    let doff = usize::from(tcp.get(12)? >> 4) * 4;
    let to_server = u16::from_be_bytes([tcp[2], tcp[3]]) == 18515;
    Some((tcp.get(doff..)?, to_server))
}

/// perftest's command line from the first line of NAME.perftest.txt: (tool, size, iterations) and the path MTU.
struct Run {
    tool: String,
    size: u32,
    iters: usize,
    mtu: u32,
}

fn perftest_run(name: &str) -> Run {
    let path = common::vectors_dir().join(name.replace(".pcap", ".perftest.txt"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let first = text.lines().next().unwrap();
    let words: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(words[0], "###", "{}", path.display());
    let arg = |flag: &str| words.iter().position(|w| *w == flag).map(|i| words[i + 1].parse::<u32>().unwrap());
    let tool = words[1].to_string();
    let size = arg("-s").unwrap_or(if tool == "ib_atomic_bw" { 8 } else { 65536 });
    let iters = arg("-n").expect("-n") as usize;
    let mtu_line = text.lines().find(|l| l.trim_start().starts_with("Mtu")).expect("Mtu line");
    let mtu = mtu_line.split(':').nth(1).unwrap().trim().trim_end_matches("[B]").parse().unwrap();
    Run { tool, size, iters, mtu }
}

/// The values perftest printed for its "local address" (client) line: QPN and PSN.
fn printed_client_qpn_psn(name: &str) -> (u32, u32) {
    let path = common::vectors_dir().join(name.replace(".pcap", ".perftest.txt"));
    let text = std::fs::read_to_string(path).unwrap();
    let line = text.lines().find(|l| l.trim_start().starts_with("local address:")).unwrap();
    let w: Vec<&str> = line.split_whitespace().collect();
    let hex = |k: &str| {
        let i = w.iter().position(|x| *x == k).unwrap();
        u32::from_str_radix(w[i + 1].trim_start_matches("0x"), 16).unwrap()
    };
    (hex("QPN"), hex("PSN"))
}

struct Capture {
    name: &'static str,
    run: Run,
    /// (time since the first frame, bytes) of every RoCE frame, in capture order.
    roce: Vec<(u64, Vec<u8>)>,
    client: Record,
    server: Record,
    /// The capture holds losses and retransmissions (drop5_*).
    lossy: bool,
    /// Frames the capture shows but the bridge dropped after the capture point: never fed to the engine.
    dropped: Vec<Vec<u8>>,
}

fn capture(name: &'static str) -> Capture {
    let frames = common::load(name);
    let t0 = frames[0].0;
    let (mut client, mut server) = (None, None);
    let mut roce = Vec::new();
    for (ts, f) in &frames {
        if let Some((payload, to_server)) = tcp_payload(f) {
            if let Some(r) = parse_record(payload) {
                let slot = if to_server { &mut client } else { &mut server };
                if let Some(prev) = *slot {
                    assert_eq!(prev, r, "{name}: the records of one side differ");
                }
                *slot = Some(r);
            }
        } else if let Ok(p) = parse_frame(f) {
            assert!(p.icrc_ok, "{name}: bad ICRC in the capture");
            roce.push(((*ts - t0).as_nanos() as u64, f.clone()));
        }
    }
    let client = client.unwrap_or_else(|| panic!("{name}: no exchange record from the client"));
    let server = server.unwrap_or_else(|| panic!("{name}: no exchange record from the server"));
    assert_eq!(printed_client_qpn_psn(name), (client.qpn, client.psn), "{name}: records vs perftest output");
    Capture {
        name,
        run: perftest_run(name),
        roce,
        client,
        server,
        lossy: name.starts_with("drop"),
        dropped: Vec::new(),
    }
}

fn parsed(f: &[u8]) -> RoceFrame<'_> {
    parse_frame(f).unwrap()
}

fn src_ip(f: &RoceFrame<'_>) -> [u8; 4] {
    match f.repr.ip.addrs {
        roce_dp::wire::IpAddrs::V4 { src, .. } => src,
        roce_dp::wire::IpAddrs::V6 { .. } => panic!("IPv6 in an IPv4 capture"),
    }
}

fn line(f: &[u8]) -> String {
    let p = parsed(f);
    let mut s = String::new();
    summary(&mut s, &p.repr, p.payload.len()).unwrap();
    s
}

// ---------------------------------------------------------------------------------------------------- messages

/// A message a side sends, reassembled from its request frames.
#[derive(Clone, Debug)]
struct Msg {
    /// Index (in `Capture::roce`) of its first packet.
    first: usize,
    opcode: WrOpcode,
    len: u32,
    payload: Vec<u8>,
    remote_va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
    imm: Option<u32>,
}

fn messages_of(cap: &Capture, ip: [u8; 4]) -> Vec<Msg> {
    let mut out: Vec<Msg> = Vec::new();
    let mut next_psn = None;
    for (i, (_, f)) in cap.roce.iter().enumerate() {
        let p = parsed(f);
        let flags = p.repr.bth.opcode.flags();
        if src_ip(&p) != ip || flags & op::REQ == 0 {
            continue;
        }
        if let Some(n) = next_psn {
            if cap.lossy && p.repr.bth.psn.before(n) {
                continue; // a retransmission: the message is already known
            }
            assert_eq!(p.repr.bth.psn, n, "{}: a retransmission or gap in the capture (frame {i})", cap.name);
        }
        let npkts = if flags & op::READ != 0 { p.repr.ext.reth.unwrap().len.div_ceil(cap.run.mtu).max(1) } else { 1 };
        next_psn = Some(p.repr.bth.psn.add(npkts));
        if flags & op::FIRST != 0 {
            let reth = p.repr.ext.reth.unwrap_or_default();
            let atomic = p.repr.ext.atomic_eth.unwrap_or_default();
            let opcode = match p.repr.bth.opcode {
                o if flags & op::SEND != 0 && flags & op::IMM_DT != 0 && o == Opcode::RC_SEND_ONLY_WITH_IMMEDIATE => {
                    WrOpcode::SendWithImm
                }
                _ if flags & op::SEND != 0 => WrOpcode::Send,
                _ if flags & op::WRITE != 0 => WrOpcode::RdmaWrite,
                _ if flags & op::READ != 0 => WrOpcode::RdmaRead,
                Opcode::RC_FETCH_ADD => WrOpcode::AtomicFetchAdd,
                Opcode::RC_COMPARE_SWAP => WrOpcode::AtomicCmpSwp,
                o => panic!("{}: request opcode {} not handled by the replay", cap.name, o.name()),
            };
            let (remote_va, rkey) =
                if p.repr.ext.atomic_eth.is_some() { (atomic.va, atomic.rkey) } else { (reth.va, reth.rkey) };
            out.push(Msg {
                first: i,
                opcode,
                len: if opcode.is_atomic() { 8 } else { reth.len },
                payload: Vec::new(),
                remote_va,
                rkey,
                swap_add: atomic.swap_add,
                compare: atomic.compare,
                imm: None,
            });
        }
        let m = out.last_mut().expect("a message starts with FIRST or ONLY");
        m.payload.extend_from_slice(p.payload);
        if flags & op::LAST != 0 {
            m.imm = p.repr.ext.imm;
            if matches!(m.opcode, WrOpcode::Send | WrOpcode::SendWithImm) {
                m.len = m.payload.len() as u32;
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------------- the engine

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

const WORK_VA: u64 = 0x6000_0000_0000;
const RECV_VA: u64 = 0x6100_0000_0000;
const EXPOSED_LEN: usize = 1 << 20;

struct Played {
    eng: Engine,
    qpn: u32,
    scq: CqId,
    rcq: CqId,
    work: MrKeys,
    recv: MrKeys,
    exposed: Option<MrKeys>,
    me: Record,
}

fn setup(cap: &Capture, side: Side, n_recv: usize, slot: u32) -> Played {
    let (me, other) = match side {
        Side::Client => (cap.client, cap.server),
        Side::Server => (cap.server, cap.client),
    };
    let mac_of = |ip: [u8; 4]| {
        cap.roce
            .iter()
            .map(|(_, f)| parsed(f))
            .find(|p| src_ip(p) == ip)
            .map(|p| p.repr.eth.src)
            .expect("a frame from each side")
    };
    // rxe sends Not-ECT frames and never a CNP (ROCE-NOTES §1.9); the engine's defaults are ECT(0) and a
    // notification point, so it is configured like rxe here to compare byte for byte.
    let cfg = EngineConfig {
        local_mac: mac_of(me.ip),
        local_ip: LocalIp { v4: Some(me.ip), v6: None },
        qpn_base: me.qpn,
        cc: roce_dp::CcConfig { np_enabled: false, ..roce_dp::CcConfig::default() },
        ..EngineConfig::default()
    };
    let mut eng = Engine::new(cfg);
    let pd = eng.alloc_pd();
    // The region perftest exchanged (remote READ/WRITE/atomic target); SEND tests exchange rkey 0 and use none.
    let exposed = (me.rkey != 0).then(|| common::reg_mr_with_key(&mut eng, pd, me.vaddr, EXPOSED_LEN, me.rkey));
    let work = eng.reg_mr(pd, WORK_VA, 4 << 20, AccessFlags::ALL).unwrap();
    let recv = eng.reg_mr(pd, RECV_VA, 4 << 20, AccessFlags::ALL).unwrap();
    let scq = eng.create_cq(1024).unwrap();
    let rcq = eng.create_cq(1024).unwrap();
    let caps = QpCaps { max_send_wr: 256, max_recv_wr: 256, ..QpCaps::default() };
    let qpn = eng.create_qp(pd, scq, rcq, caps).unwrap();
    assert_eq!(qpn, me.qpn);
    let q = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    eng.modify_qp(qpn, &QpAttr { access: Some(AccessFlags::ALL), ..q(QpState::Init) }).unwrap();
    for i in 0..n_recv {
        let sge = Sge { addr: RECV_VA + u64::from(slot) * i as u64, len: slot, lkey: recv.lkey };
        eng.post_recv(qpn, 1000 + i as u64, &[sge]).unwrap();
    }
    let rd_atomic = me.out_reads.min(other.out_reads).clamp(1, 128) as u8;
    eng.modify_qp(
        qpn,
        &QpAttr {
            path_mtu: Some(cap.run.mtu),
            dest_qpn: Some(other.qpn),
            rq_psn: Some(other.psn),
            max_dest_rd_atomic: Some(me.out_reads.clamp(1, 128) as u8),
            peer: Some(PeerAddr {
                ip: roce_dp::wire::IpAddrs::V4 { src: me.ip, dst: other.ip },
                mac: mac_of(other.ip),
            }),
            ecn: Some(roce_dp::wire::Ecn::NotEct),
            ..q(QpState::Rtr)
        },
    )
    .unwrap();
    eng.modify_qp(
        qpn,
        &QpAttr {
            sq_psn: Some(me.psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(rd_atomic),
            ..q(QpState::Rts)
        },
    )
    .unwrap();
    Played { eng, qpn, scq, rcq, work, recv, exposed, me }
}

struct Outcome {
    /// What the engine sent, in order.
    sent: Vec<Vec<u8>>,
    /// The played side's frames in the capture, in order.
    want: Vec<Vec<u8>>,
    send_cqes: Vec<Cqe>,
    recv_cqes: Vec<Cqe>,
    played: Played,
    my_msgs: Vec<Msg>,
    their_msgs: Vec<Msg>,
    /// (capture index of a frame fed to the engine, number of frames the engine had sent before it).
    after_rx: Vec<(usize, usize)>,
}

/// Loads memory the played side's peer reads without anything in the capture writing it first: READ sources from
/// the READ responses, atomic targets from the atomic ACKs (original values). Only the first response that covers
/// a byte loads it.
fn preload(cap: &Capture, pl: &mut Played, their_msgs: &[Msg]) {
    let Some(x) = pl.exposed else { return };
    let base = pl.me.vaddr;
    let mut loaded = vec![false; EXPOSED_LEN];
    let mut resp_of_psn = std::collections::HashMap::new();
    for (_, f) in &cap.roce {
        let p = parsed(f);
        if src_ip(&p) == pl.me.ip && p.repr.bth.opcode.flags() & op::RESP != 0 {
            resp_of_psn.entry(p.repr.bth.psn.value()).or_insert_with(|| (p.repr.ext.atomic_ack, p.payload.to_vec()));
        }
    }
    for m in their_msgs {
        let psn0 = parsed(&cap.roce[m.first].1).repr.bth.psn;
        let mem = pl.eng.mr_bytes_mut(x.lkey).unwrap();
        let off0 = (m.remote_va - base) as usize;
        match m.opcode {
            WrOpcode::RdmaRead => {
                let mut off = off0;
                for k in 0..m.len.div_ceil(cap.run.mtu).max(1) {
                    let (_, data) = &resp_of_psn[&psn0.add(k).value()];
                    for (j, b) in data.iter().enumerate() {
                        if !loaded[off + j] {
                            mem[off + j] = *b;
                            loaded[off + j] = true;
                        }
                    }
                    off += data.len();
                }
            }
            WrOpcode::AtomicFetchAdd | WrOpcode::AtomicCmpSwp => {
                let orig = resp_of_psn[&psn0.value()].0.expect("atomic ACK");
                if !loaded[off0] {
                    mem[off0..off0 + 8].copy_from_slice(&orig.to_le_bytes());
                    loaded[off0..off0 + 8].fill(true);
                }
            }
            _ => {
                // SEND/WRITE: written by the peer before anything reads it.
                loaded[off0..off0 + m.len as usize].fill(true);
            }
        }
    }
}

fn replay(cap: &Capture, side: Side) -> Outcome {
    let me = if side == Side::Client { cap.client } else { cap.server };
    let other = if side == Side::Client { cap.server } else { cap.client };
    let my_msgs = messages_of(cap, me.ip);
    let their_msgs = messages_of(cap, other.ip);
    let their_sends = their_msgs.iter().filter(|m| matches!(m.opcode, WrOpcode::Send | WrOpcode::SendWithImm)).count();
    let slot = cap.run.size.max(64);
    let mut pl = setup(cap, side, their_sends, slot);
    preload(cap, &mut pl, &their_msgs);
    let qpn = pl.qpn;
    let base = Instant(1_000_000_000);
    let mut sent = Vec::new();
    let mut buf = vec![0u8; 9000];
    let mut drain = |eng: &mut Engine, now: Instant, sent: &mut Vec<Vec<u8>>| {
        while let Some(n) = eng.poll_transmit(now, &mut buf) {
            sent.push(buf[..n].to_vec());
        }
    };
    let mut next_msg = 0;
    let mut want = Vec::new();
    let mut after_rx = Vec::new();
    for (i, (ts, f)) in cap.roce.iter().enumerate() {
        let now = Instant(base.0 + ts);
        while let Some(d) = pl.eng.poll_timeout() {
            if d > now {
                break;
            }
            pl.eng.handle_timeout(d);
            drain(&mut pl.eng, d, &mut sent);
        }
        if src_ip(&parsed(f)) == me.ip {
            want.push(f.clone());
            if my_msgs.get(next_msg).is_some_and(|m| m.first == i) {
                let m = &my_msgs[next_msg];
                let off = u64::from(slot) * next_msg as u64;
                let local = Sge { addr: WORK_VA + off, len: m.len, lkey: pl.work.lkey };
                if !m.payload.is_empty() && !matches!(m.opcode, WrOpcode::RdmaRead) {
                    let w = pl.eng.mr_bytes_mut(pl.work.lkey).unwrap();
                    w[off as usize..off as usize + m.payload.len()].copy_from_slice(&m.payload);
                }
                let mut wr = SendWr::new(next_msg as u64, m.opcode).remote(m.remote_va, m.rkey);
                wr.compare_add = if m.opcode == WrOpcode::AtomicCmpSwp { m.compare } else { m.swap_add };
                wr.swap = m.swap_add;
                if let Some(imm) = m.imm {
                    wr.imm = imm;
                }
                pl.eng.post_send(qpn, &wr, &[local]).unwrap();
                next_msg += 1;
            }
        } else {
            if cap.dropped.contains(f) {
                continue;
            }
            pl.eng.handle_rx(now, f, RxMeta::default());
            after_rx.push((i, sent.len()));
        }
        drain(&mut pl.eng, now, &mut sent);
    }
    assert_eq!(next_msg, my_msgs.len());
    let mut send_cqes = Vec::new();
    while let Some(c) = pl.eng.poll_cq_one(pl.scq) {
        send_cqes.push(c);
    }
    let mut recv_cqes = Vec::new();
    while let Some(c) = pl.eng.poll_cq_one(pl.rcq) {
        recv_cqes.push(c);
    }
    Outcome { sent, want, send_cqes, recv_cqes, played: pl, my_msgs, their_msgs, after_rx }
}

/// Names the fields of the differing bytes of two untagged IPv4 RoCE frames.
fn diff_fields(a: &[u8], b: &[u8]) -> String {
    let name = |i: usize| match i {
        0..=11 => "MAC",
        12..=13 => "EtherType",
        15 => "TOS",
        16..=17 => "IP total length",
        20..=21 => "IP flags/fragment",
        22 => "TTL",
        24..=25 => "IP checksum",
        26..=33 => "IP address",
        34..=35 => "UDP source port",
        36..=41 => "UDP",
        42 => "BTH opcode",
        43 => "BTH flags/pad",
        44..=53 => "BTH",
        _ if i + 4 >= a.len().min(b.len()) => "ICRC",
        _ => "extension headers / payload",
    };
    let mut names: Vec<&str> = Vec::new();
    for i in 0..a.len().min(b.len()) {
        if a[i] != b[i] && !names.contains(&name(i)) {
            names.push(name(i));
        }
    }
    if a.len() != b.len() {
        names.push("length");
    }
    names.join(", ")
}

/// Every frame the engine sent equals the capture's, apart from the IP identification.
fn assert_same_frames(cap: &Capture, side: Side, o: &Outcome) {
    let mut report = String::new();
    for i in 0..o.sent.len().max(o.want.len()) {
        match (o.sent.get(i), o.want.get(i)) {
            (Some(s), Some(w)) => {
                // The engine's own IPv4 checksum and ICRC must be right before both are recomputed for the ID.
                assert!(parse_frame(s).is_ok_and(|p| p.icrc_ok), "{}: engine frame {i} is malformed", cap.name);
                let s2 = with_ip_id(s, harness::ip_id(w));
                if s2 != *w {
                    let _ = writeln!(
                        report,
                        "  frame {i}: differs in {}\n    engine: {}\n    rxe:    {}",
                        diff_fields(&s2, w),
                        line(s),
                        line(w)
                    );
                }
            }
            (Some(s), None) => {
                let _ = writeln!(report, "  frame {i}: extra from the engine: {}", line(s));
            }
            (None, Some(w)) => {
                let _ = writeln!(report, "  frame {i}: missing, rxe sent: {}", line(w));
            }
            (None, None) => unreachable!(),
        }
    }
    assert!(
        report.is_empty(),
        "{} playing the {side:?}: {} frames sent, {} in the capture\n{report}",
        cap.name,
        o.sent.len(),
        o.want.len()
    );
}

/// The WRs derived from the capture are perftest's: `iters` messages of `size` bytes.
fn assert_perftest_workload(cap: &Capture, msgs: &[Msg]) {
    assert_eq!(msgs.len(), cap.run.iters, "{}: messages vs -n", cap.name);
    for m in msgs {
        assert_eq!(m.len, cap.run.size, "{}: message length vs -s", cap.name);
    }
}

fn check_completions(cap: &Capture, o: &Outcome) {
    let n = o.my_msgs.len();
    let ids: Vec<(u64, WcStatus)> = o.send_cqes.iter().map(|c| (c.wr_id, c.status)).collect();
    let want: Vec<(u64, WcStatus)> = (0..n as u64).map(|i| (i, WcStatus::Success)).collect();
    assert_eq!(ids, want, "{}: send completions", cap.name);
    for (c, m) in o.send_cqes.iter().zip(&o.my_msgs) {
        assert_eq!(c.opcode, m.opcode.wc_opcode(), "{}", cap.name);
        if m.opcode == WrOpcode::RdmaRead {
            assert_eq!(c.byte_len, m.len, "{}", cap.name);
        }
    }
    // Receives: one per SEND of the other side, in order, with its bytes.
    let sends: Vec<&Msg> =
        o.their_msgs.iter().filter(|m| matches!(m.opcode, WrOpcode::Send | WrOpcode::SendWithImm)).collect();
    assert_eq!(o.recv_cqes.len(), sends.len(), "{}: receive completions", cap.name);
    let slot = cap.run.size.max(64) as usize;
    let recv = o.played.eng.mr_bytes(o.played.recv.lkey).unwrap();
    for (i, (c, m)) in o.recv_cqes.iter().zip(&sends).enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len),
            (1000 + i as u64, WcStatus::Success, WcOpcode::Recv, m.len)
        );
        assert_eq!(&recv[i * slot..i * slot + m.payload.len()], &m.payload[..], "{}: received bytes", cap.name);
    }
}

/// What the played side's memory must hold after the replay: the other side's last WRITE to each byte, READ
/// results and atomic originals in the work buffer.
fn check_memory(cap: &Capture, o: &Outcome) {
    let pl = &o.played;
    let slot = cap.run.size.max(64) as usize;
    if let Some(x) = pl.exposed {
        let mem = pl.eng.mr_bytes(x.lkey).unwrap();
        let mut want: Vec<Option<u8>> = vec![None; EXPOSED_LEN];
        let mut adds: std::collections::BTreeMap<usize, u64> = Default::default();
        for m in &o.their_msgs {
            let off = (m.remote_va - pl.me.vaddr) as usize;
            match m.opcode {
                WrOpcode::RdmaWrite => {
                    for (j, b) in m.payload.iter().enumerate() {
                        want[off + j] = Some(*b);
                    }
                }
                WrOpcode::AtomicFetchAdd => *adds.entry(off).or_default() += m.swap_add,
                _ => {}
            }
        }
        for (i, w) in want.iter().enumerate() {
            if let Some(b) = w {
                assert_eq!(mem[i], *b, "{}: byte {i:#x} of the exposed region", cap.name);
            }
        }
        // Each atomic target holds the first original value plus every add (the atomic ACKs reveal the first).
        let mut first_orig = std::collections::BTreeMap::new();
        for (_, f) in &cap.roce {
            let p = parsed(f);
            if p.repr.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE && src_ip(&p) == pl.me.ip {
                let m =
                    o.their_msgs.iter().find(|m| parsed(&cap.roce[m.first].1).repr.bth.psn == p.repr.bth.psn).unwrap();
                first_orig.entry((m.remote_va - pl.me.vaddr) as usize).or_insert(p.repr.ext.atomic_ack.unwrap());
            }
        }
        for (off, add) in adds {
            let v = u64::from_le_bytes(mem[off..off + 8].try_into().unwrap());
            assert_eq!(v, first_orig[&off].wrapping_add(add), "{}: atomic target at +{off:#x}", cap.name);
        }
    }
    // READ results and atomic originals land in the work buffer.
    let work = pl.eng.mr_bytes(pl.work.lkey).unwrap();
    for (k, m) in o.my_msgs.iter().enumerate() {
        let at = k * slot;
        match m.opcode {
            WrOpcode::RdmaRead => {
                let data: Vec<u8> = responses_to(cap, pl.me.ip, &cap.roce[m.first].1, m.len);
                assert_eq!(&work[at..at + m.len as usize], &data[..], "{}: READ {k} result", cap.name);
            }
            WrOpcode::AtomicFetchAdd | WrOpcode::AtomicCmpSwp => {
                let orig = responses_atomic(cap, pl.me.ip, &cap.roce[m.first].1);
                assert_eq!(u64::from_le_bytes(work[at..at + 8].try_into().unwrap()), orig, "{}: atomic {k}", cap.name);
            }
            _ => {}
        }
    }
}

/// The payload of the READ responses the other side sent for the READ request `req` of side `me`.
fn responses_to(cap: &Capture, me: [u8; 4], req: &[u8], len: u32) -> Vec<u8> {
    let psn0 = parsed(req).repr.bth.psn;
    let n = len.div_ceil(cap.run.mtu).max(1);
    let mut out = Vec::new();
    for k in 0..n {
        let f = cap
            .roce
            .iter()
            .map(|(_, f)| parsed(f))
            .find(|p| src_ip(p) != me && p.repr.bth.psn == psn0.add(k) && p.repr.bth.opcode.flags() & op::RESP != 0)
            .expect("READ response");
        out.extend_from_slice(f.payload);
    }
    out
}

fn responses_atomic(cap: &Capture, me: [u8; 4], req: &[u8]) -> u64 {
    let psn = parsed(req).repr.bth.psn;
    cap.roce
        .iter()
        .map(|(_, f)| parsed(f))
        .find(|p| src_ip(p) != me && p.repr.bth.psn == psn && p.repr.bth.opcode == Opcode::RC_ATOMIC_ACKNOWLEDGE)
        .and_then(|p| p.repr.ext.atomic_ack)
        .expect("atomic ACK")
}

fn run(name: &'static str, side: Side) {
    let cap = capture(name);
    let o = replay(&cap, side);
    let requester_msgs = if cap.run.tool.contains("_lat") || side == Side::Client { &o.my_msgs } else { &o.their_msgs };
    assert_perftest_workload(&cap, requester_msgs);
    assert!(!o.want.is_empty(), "{name}: the {side:?} sent nothing in the capture");
    assert_same_frames(&cap, side, &o);
    check_completions(&cap, &o);
    check_memory(&cap, &o);
    let st = o.played.eng.stats();
    let dropped: u64 = st.iter().filter(|(n, _)| n.starts_with("rx_drop")).map(|(_, v)| v).sum();
    assert_eq!(dropped, 0, "{name}: frames dropped by the engine: {st:?}");
    let c = o.played.eng.qp_counters(o.played.qpn).unwrap();
    assert_eq!((c.bad_responses, c.duplicate_responses, c.retransmitted_packets), (0, 0, 0), "{name}: {c:?}");
    assert_eq!(o.played.eng.query_qp(o.played.qpn).unwrap().state, QpState::Rts);
}

// ---------------------------------------------------------------------------------------------------- the tests

#[test]
fn exchange_records_decode() {
    let c = capture("rc_write_4k.pcap");
    // ../shared/vectors/rxe/oob-exchange-ib_write_bw.txt
    assert_eq!(
        c.client,
        Record {
            out_reads: 1,
            qpn: 0x2f,
            psn: 0xdab31a,
            rkey: 0x20bb,
            vaddr: 0x0000_55c4_cf0e_2000,
            ip: [10, 50, 0, 1]
        }
    );
    assert_eq!(
        c.server,
        Record {
            out_reads: 1,
            qpn: 0x2f,
            psn: 0xdccf61,
            rkey: 0x2059,
            vaddr: 0x0000_55ca_1e0e_b000,
            ip: [10, 50, 0, 2]
        }
    );
    assert_eq!((c.run.tool.as_str(), c.run.size, c.run.iters, c.run.mtu), ("ib_write_bw", 4096, 20, 1024));
}

#[test]
fn regions_can_carry_the_captured_rkeys() {
    for key in [0x20bb, 0x2059, 0x219d, 0x0001, 0x0100, 0x0300] {
        let mut eng = Engine::new(EngineConfig::default());
        let pd = eng.alloc_pd();
        let k = common::reg_mr_with_key(&mut eng, pd, 0x1000, 64, key);
        assert_eq!((k.lkey, k.rkey), (key, key));
    }
}

#[test]
fn rc_send_4k_server() {
    run("rc_send_4k.pcap", Side::Server);
}

#[test]
fn rc_send_4k_client() {
    run("rc_send_4k.pcap", Side::Client);
}

#[test]
fn rc_write_4k_server() {
    run("rc_write_4k.pcap", Side::Server);
}

#[test]
fn rc_write_4k_client() {
    run("rc_write_4k.pcap", Side::Client);
}

#[test]
fn rc_read_4k_server() {
    run("rc_read_4k.pcap", Side::Server);
}

#[test]
fn rc_read_4k_client() {
    run("rc_read_4k.pcap", Side::Client);
}

#[test]
fn rc_atomic_server() {
    run("rc_atomic.pcap", Side::Server);
}

#[test]
fn rc_atomic_client() {
    run("rc_atomic.pcap", Side::Client);
}

#[test]
fn rc_send_lat_64_server() {
    run("rc_send_lat_64.pcap", Side::Server);
}

#[test]
fn rc_send_lat_64_client() {
    run("rc_send_lat_64.pcap", Side::Client);
}

#[test]
fn rc_write_lat_64_server() {
    run("rc_write_lat_64.pcap", Side::Server);
}

#[test]
fn rc_write_lat_64_client() {
    run("rc_write_lat_64.pcap", Side::Client);
}

/// The sender's side of a run with 5 % loss on the bridge (drop5_write_tapa0.pcap, captured at the sender): rxe's
/// ACKs and sequence-error NAKs are fed to the engine playing the sender. Timing differs (the engine sends what
/// the window allows at once, rxe paces), so frames are compared per PSN: every frame the engine sends, first
/// transmission or go-back-N retransmission, must equal rxe's frame with that PSN byte for byte apart from the IP
/// ID; after each NAK the engine must go back to exactly the NAK's PSN; all 25 WRITEs complete in order.
#[test]
fn drop5_write_sender_recovers_from_rxe_naks() {
    let cap = capture("drop5_write_tapa0.pcap");
    let me = cap.client;
    let mut by_psn: std::collections::HashMap<u32, Vec<u8>> = Default::default();
    let mut naks = Vec::new();
    for (_, f) in &cap.roce {
        let p = parsed(f);
        if src_ip(&p) == me.ip {
            by_psn.entry(p.repr.bth.psn.value()).or_insert_with(|| f.clone());
        } else if p.repr.ext.aeth.is_some_and(|a| a.syndrome == 0x60) {
            naks.push(p.repr.bth.psn.value());
        }
    }
    assert!(naks.len() >= 2, "the capture holds sequence-error NAKs: {naks:?}");
    let o = replay(&cap, Side::Client);
    for &(i, n) in &o.after_rx {
        let p = parsed(&cap.roce[i].1);
        if p.repr.ext.aeth.is_some_and(|a| a.syndrome == 0x60) {
            let next = o.sent.get(n).map(|s| parsed(s).repr.bth.psn.value());
            assert_eq!(
                next,
                Some(p.repr.bth.psn.value()),
                "after the NAK of capture frame {i}: {}",
                line(&cap.roce[i].1)
            );
        }
    }
    assert_perftest_workload(&cap, &o.my_msgs);
    for (i, s) in o.sent.iter().enumerate() {
        let psn = parsed(s).repr.bth.psn.value();
        let w = by_psn.get(&psn).unwrap_or_else(|| panic!("engine frame {i} has a PSN rxe never sent: {}", line(s)));
        assert!(
            with_ip_id(s, harness::ip_id(w)) == *w,
            "engine frame {i} differs from rxe's frame of that PSN in {}\n  engine: {}\n  rxe:    {}",
            diff_fields(&with_ip_id(s, harness::ip_id(w)), w),
            line(s),
            line(w)
        );
    }
    // Every PSN rxe sent was sent by the engine too.
    let sent: std::collections::HashSet<u32> = o.sent.iter().map(|s| parsed(s).repr.bth.psn.value()).collect();
    let mut missing: Vec<u32> = by_psn.keys().filter(|p| !sent.contains(p)).copied().collect();
    missing.sort_unstable();
    assert!(missing.is_empty(), "PSNs rxe sent and the engine did not: {missing:x?}");
    let c = o.played.eng.qp_counters(o.played.qpn).unwrap();
    assert_eq!(c.nak_psn_seq_rcvd, naks.len() as u64, "{c:?}");
    assert!(c.retransmitted_packets > 0 && c.rewinds > 0, "{c:?}");
    check_completions(&cap, &o);
    assert_eq!(o.played.eng.query_qp(o.played.qpn).unwrap().state, QpState::Rts);
}

/// ecn_ce_all_write_tapa0.pcap, captured at the sender: the bridge marked every frame CE, so rxe's ACKs arrive with
/// ECN = CE. The engine as sender must accept them (the ICRC masks the TOS byte) and send exactly rxe's requests.
#[test]
fn ecn_ce_all_write_client_accepts_ce_marked_acks() {
    let cap = capture("ecn_ce_all_write_tapa0.pcap");
    let ce = cap
        .roce
        .iter()
        .map(|(_, f)| parsed(f))
        .filter(|p| src_ip(p) == cap.server.ip && p.repr.ip.ecn == roce_dp::wire::Ecn::Ce)
        .count();
    assert_eq!(ce, 20, "the server's ACKs in this capture are CE-marked");
    run("ecn_ce_all_write_tapa0.pcap", Side::Client);
}

/// rxe's UC WRITEs and UD SENDs addressed to an RC QP with the same QPN and peer: every frame is a counted drop
/// (wrong transport), nothing is answered, nothing is written.
#[test]
fn uc_and_ud_captures_into_an_rc_qp_are_counted_drops() {
    for name in ["uc_write_4k.pcap", "ud_send_1k.pcap"] {
        let frames: Vec<Vec<u8>> =
            common::load(name).into_iter().map(|(_, f)| f).filter(|f| parse_frame(f).is_ok()).collect();
        let first = parsed(&frames[0]);
        let (src, dst) = match first.repr.ip.addrs {
            roce_dp::wire::IpAddrs::V4 { src, dst } => (src, dst),
            roce_dp::wire::IpAddrs::V6 { .. } => unreachable!(),
        };
        let qpn = first.repr.bth.dest_qp;
        let cfg = EngineConfig {
            local_mac: first.repr.eth.dst,
            local_ip: LocalIp { v4: Some(dst), v6: None },
            qpn_base: qpn,
            ..EngineConfig::default()
        };
        let mut eng = Engine::new(cfg);
        let pd = eng.alloc_pd();
        let mr = eng.reg_mr(pd, 0, 1 << 20, AccessFlags::ALL).unwrap();
        let cq = eng.create_cq(64).unwrap();
        let q = eng.create_qp(pd, cq, cq, QpCaps::default()).unwrap();
        let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        eng.modify_qp(q, &QpAttr { access: Some(AccessFlags::ALL), ..st(QpState::Init) }).unwrap();
        eng.post_recv(q, 1, &[Sge { addr: 0, len: 4096, lkey: mr.lkey }]).unwrap();
        let peer = PeerAddr { ip: roce_dp::wire::IpAddrs::V4 { src: dst, dst: src }, mac: first.repr.eth.src };
        let rtr = QpAttr {
            path_mtu: Some(1024),
            dest_qpn: Some(qpn),
            rq_psn: Some(first.repr.bth.psn.value()),
            peer: Some(peer),
            ..st(QpState::Rtr)
        };
        eng.modify_qp(q, &rtr).unwrap();
        eng.modify_qp(q, &QpAttr { sq_psn: Some(0), ..st(QpState::Rts) }).unwrap();
        let mine: Vec<&Vec<u8>> = frames.iter().filter(|f| src_ip(&parsed(f)) == src).collect();
        assert!(mine.len() >= 20, "{name}");
        for f in &mine {
            eng.handle_rx(Instant(0), f, RxMeta::default());
        }
        assert_eq!(eng.stats().rx_drop_wrong_transport, mine.len() as u64, "{name}: {:?}", eng.stats());
        let mut buf = vec![0u8; 9000];
        assert_eq!(eng.poll_transmit(Instant(0), &mut buf), None, "{name}");
        assert!(eng.poll_cq_one(cq).is_none(), "{name}");
        assert!(eng.mr_bytes(mr.lkey).unwrap().iter().all(|&b| b == 0), "{name}");
    }
}

/// The receiver's side of the 5 % loss run: the sender's frames that crossed the bridge (drop5_write_annotated.txt
/// lists the ones it dropped, by frame number in the sender-side capture) are fed to the engine playing the
/// server; its ACKs and sequence-error NAKs must be rxe's, byte for byte apart from the IP ID, in the same order:
/// one NAK per gap with the expected PSN and the MSN of completed messages, out-of-sequence packets discarded
/// silently until the expected PSN arrives (ROCE-NOTES §1.5).
#[test]
fn drop5_write_receiver_naks_like_rxe() {
    let name = "drop5_write_tapa0.pcap";
    let notes = std::fs::read_to_string(common::vectors_dir().join("drop5_write_annotated.txt")).unwrap();
    let dropped_numbers: Vec<usize> = notes
        .lines()
        .filter(|l| l.contains("DROPPED") && l.contains("A->B"))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(dropped_numbers.len(), 10, "drop5_write_annotated.txt");
    let all = common::load(name);
    let mut cap = capture(name);
    cap.dropped = dropped_numbers.iter().map(|&n| all[n - 1].1.clone()).collect();
    for d in &cap.dropped {
        assert_eq!(src_ip(&parsed(d)), cap.client.ip, "a dropped frame is the sender's");
    }
    let o = replay(&cap, Side::Server);
    assert_eq!(o.want.iter().filter(|f| parsed(f).repr.ext.aeth.is_some_and(|a| a.syndrome == 0x60)).count(), 4);
    assert_same_frames(&cap, Side::Server, &o);
    check_memory(&cap, &o);
    let c = o.played.eng.qp_counters(o.played.qpn).unwrap();
    assert_eq!(c.nak_psn_seq_sent, 4, "{c:?}");
}
