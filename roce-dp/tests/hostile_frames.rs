//! Hostile wire input built from real bytes: the Linux rxe captures (tests/vectors/rxe) replayed into an engine
//! playing one side of each connection, with the other side's frames mutated on the way in. The mutations know the
//! frame's structure (the opcode table gives every header's place): opcode, PSN, destination QP, AckReq/SE/M, pad
//! count, transport version, RETH va/len/rkey, AETH syndrome/MSN, AtomicETH and AtomicAckETH, immediate data and
//! IETH, payload length against the path MTU, IP/UDP length fields, ECN CE marks and frames turned into CNPs (half the
//! runs with DCQCN on), truncation and bit flips, each field set to edge values (0, 1, 2^23, 2^24 - 1, 2^31,
//! 2^32 - 1, just past a region, va wrap-around, another region's key, ...).
//! Lengths, the IPv4 checksum and the ICRC are recomputed afterwards (most of the time) so the mutation reaches the
//! transport checks instead of dying at the ICRC. Frames are also duplicated, replayed late and reordered.
//!
//! The rules checked after every frame, for every seed (issues 3, 4 and 7): no panic; nothing written outside the
//! registered regions the frame could legitimately reach (guard regions without remote rights sit right below and
//! above every region, filled with a pattern); every frame the engine sends parses with a good ICRC and goes to the
//! peer; the QP is in RTS or ERR. At the end, with time advancing and the peer silent: every work request the played
//! side posted has exactly one completion, in posting order, and an error completion means the QP is in ERR. A
//! control run without mutations must replay cleanly (every WR successful, no drop), so the setup is the real one.
//!
//! Seeded and bounded: `ROCE_HOSTILE_SEED` picks the seed, `ROCE_HOSTILE_ITERS` the iterations per capture and
//! side, `ROCE_HOSTILE_SOAK=1` runs 100 times as many; a failure prints the seed of the failing iteration
//! (`ROCE_HOSTILE_SEED=<seed> ROCE_HOSTILE_ITERS=1` replays exactly that one, `ROCE_HOSTILE_TRACE=1` prints it).

mod common;
mod seeded;

use seeded::Seeds;

use roce_dp::sim::SimRng;
use roce_dp::wire::{self, op, parse_frame, OpInfo, Opcode};
use roce_dp::{
    AccessFlags, CqId, Duration, Engine, EngineConfig, Instant, LocalIp, MrKeys, PeerAddr, QpAttr, QpCaps, QpState,
    RxMeta, SendWr, Sge, WcStatus, WrOpcode,
};
use std::collections::VecDeque;

// ---------------------------------------------------------------------------------------------------- the captures

const CAPTURES: &[&str] = &[
    "rc_send_4k.pcap",
    "rc_write_4k.pcap",
    "rc_read_4k.pcap",
    "rc_atomic.pcap",
    "rc_send_lat_64.pcap",
    "rc_write_lat_64.pcap",
    "drop5_write_tapa0.pcap",
    "ecn_ce_all_write_tapa0.pcap",
];

/// One side of a captured connection, as its frames show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct End {
    ip: [u8; 4],
    mac: wire::MacAddr,
    /// Its QPN (the destination QP of the frames sent to it).
    qpn: u32,
    /// The PSN of its first request, if it sent any.
    first_psn: Option<u32>,
}

/// A message one side sends, reassembled from its request frames (first transmissions only).
#[derive(Clone, Debug)]
struct Msg {
    /// Capture time of its first packet (ns since the first frame).
    at: u64,
    opcode: WrOpcode,
    payload: Vec<u8>,
    len: u32,
    remote_va: u64,
    rkey: u32,
    swap_add: u64,
    compare: u64,
    imm: Option<u32>,
}

struct Capture {
    name: &'static str,
    mtu: u32,
    /// (ns since the first frame, bytes) of every RoCE frame.
    frames: Vec<(u64, Vec<u8>)>,
    ends: [End; 2],
}

fn src_ip(f: &[u8]) -> [u8; 4] {
    f[26..30].try_into().unwrap()
}

fn load(name: &'static str) -> Capture {
    let raw = common::load(name);
    let t0 = raw[0].0;
    let frames: Vec<(u64, Vec<u8>)> = raw
        .into_iter()
        .filter(|(_, f)| parse_frame(f).is_ok_and(|p| p.icrc_ok))
        .map(|(t, f)| ((t - t0).as_nanos() as u64, f))
        .collect();
    let text = std::fs::read_to_string(common::vectors_dir().join(name.replace(".pcap", ".perftest.txt"))).unwrap();
    let mtu_line = text.lines().find(|l| l.trim_start().starts_with("Mtu")).expect("Mtu line");
    let mtu = mtu_line.split(':').nth(1).unwrap().trim().trim_end_matches("[B]").parse().unwrap();
    let mut ends = [End::default(); 2];
    ends[0].ip = src_ip(&frames[0].1);
    for (_, f) in &frames {
        let p = parse_frame(f).unwrap();
        let i = usize::from(src_ip(f) != ends[0].ip);
        let wire::IpAddrs::V4 { src, dst } = p.repr.ip.addrs else { panic!("IPv6 in {name}") };
        ends[i].ip = src;
        ends[i].mac = p.repr.eth.src;
        ends[1 - i].ip = dst;
        ends[1 - i].mac = p.repr.eth.dst;
        ends[1 - i].qpn = p.repr.bth.dest_qp;
        if p.repr.bth.opcode.flags() & op::REQ != 0 && ends[i].first_psn.is_none() {
            ends[i].first_psn = Some(p.repr.bth.psn.value());
        }
    }
    Capture { name, mtu, frames, ends }
}

/// The messages side `ip` sends, from its request frames (retransmissions skipped).
fn messages_of(cap: &Capture, ip: [u8; 4]) -> Vec<Msg> {
    let mut out: Vec<Msg> = Vec::new();
    let mut next: Option<wire::Psn> = None;
    for (t, f) in &cap.frames {
        let p = parse_frame(f).unwrap();
        let flags = p.repr.bth.opcode.flags();
        if src_ip(f) != ip || flags & op::REQ == 0 {
            continue;
        }
        if next.is_some_and(|n| p.repr.bth.psn.before(n)) {
            continue;
        }
        let n = if flags & op::READ != 0 { p.repr.ext.reth.unwrap().len.div_ceil(cap.mtu).max(1) } else { 1 };
        next = Some(p.repr.bth.psn.add(n));
        if flags & op::FIRST != 0 {
            let reth = p.repr.ext.reth.unwrap_or_default();
            let at = p.repr.ext.atomic_eth;
            let opcode = match p.repr.bth.opcode {
                Opcode::RC_FETCH_ADD => WrOpcode::AtomicFetchAdd,
                Opcode::RC_COMPARE_SWAP => WrOpcode::AtomicCmpSwp,
                _ if flags & op::IMM_DT != 0 && flags & op::SEND != 0 => WrOpcode::SendWithImm,
                _ if flags & op::SEND != 0 => WrOpcode::Send,
                _ if flags & op::WRITE != 0 => WrOpcode::RdmaWrite,
                _ => WrOpcode::RdmaRead,
            };
            let (remote_va, rkey) = at.map_or((reth.va, reth.rkey), |a| (a.va, a.rkey));
            out.push(Msg {
                at: *t,
                opcode,
                payload: Vec::new(),
                len: if opcode.is_atomic() { 8 } else { reth.len },
                remote_va,
                rkey,
                swap_add: at.map_or(0, |a| a.swap_add),
                compare: at.map_or(0, |a| a.compare),
                imm: None,
            });
        }
        let m = out.last_mut().expect("a message starts with FIRST or ONLY");
        m.payload.extend_from_slice(p.payload);
        if flags & op::LAST != 0 {
            m.imm = p.repr.ext.imm;
            if flags & op::SEND != 0 {
                m.len = m.payload.len() as u32;
            }
        }
    }
    out
}

/// The (va, len, rkey) of every RETH/AtomicETH in frames sent to side `ip`: the remote accesses it serves.
fn targets(cap: &Capture, ip: [u8; 4]) -> Vec<(u64, u64, u32)> {
    let mut v = Vec::new();
    for (_, f) in &cap.frames {
        if src_ip(f) == ip {
            continue;
        }
        let p = parse_frame(f).unwrap();
        if let Some(r) = p.repr.ext.reth {
            v.push((r.va, u64::from(r.len), r.rkey));
        }
        if let Some(a) = p.repr.ext.atomic_eth {
            v.push((a.va, 8, a.rkey));
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------------- the played side

const GUARD: usize = 4096;
const GUARD_BYTE: u8 = 0x5a;
const WORK_VA: u64 = 0x6000_0000_0000;
const RECV_VA: u64 = 0x6100_0000_0000;
const RECV_SLOT: u64 = 16 * 1024;

struct Played {
    eng: Engine,
    qpn: u32,
    scq: CqId,
    rcq: CqId,
    /// Every region with its (va, len): the exposed one (if any), the work and the receive region.
    regions: Vec<MrKeys>,
    /// Guard regions (no rights), two per region.
    guards: Vec<MrKeys>,
    work: MrKeys,
    posted: Vec<(u64, WrOpcode)>,
    recvs: u64,
}

/// Registers `len` bytes at `va` (with `key` if given) between two guard regions.
fn guarded(
    eng: &mut Engine,
    pd: roce_dp::Pd,
    va: u64,
    len: usize,
    key: Option<u32>,
    guards: &mut Vec<MrKeys>,
) -> MrKeys {
    let k = match key {
        Some(key) => common::reg_mr_with_key(eng, pd, va, len, key),
        None => eng.reg_mr(pd, va, len, AccessFlags::ALL).unwrap(),
    };
    for gva in [va - GUARD as u64, va + len as u64] {
        let g = eng.reg_mr(pd, gva, GUARD, AccessFlags::NONE).unwrap();
        eng.mr_bytes_mut(g.lkey).unwrap().fill(GUARD_BYTE);
        guards.push(g);
    }
    k
}

fn setup(cap: &Capture, me: usize, msgs: &[Msg], their_sends: usize, dcqcn: bool) -> Played {
    let (m, o) = (cap.ends[me], cap.ends[1 - me]);
    let mut cfg = EngineConfig {
        local_mac: m.mac,
        local_ip: LocalIp { v4: Some(m.ip), v6: None },
        qpn_base: m.qpn,
        ..EngineConfig::default()
    };
    if dcqcn {
        cfg.cc.algorithm = roce_dp::CcAlgorithm::Dcqcn;
    }
    let mut eng = Engine::new(cfg);
    let pd = eng.alloc_pd();
    let mut guards = Vec::new();
    let mut regions = Vec::new();
    // The region the peer's READs, WRITEs and atomics target: exactly the span they touch, under their rkey.
    let t = targets(cap, m.ip);
    if let Some(&(_, _, rkey)) = t.first() {
        assert!(t.iter().all(|x| x.2 == rkey), "{}: one rkey per side", cap.name);
        let lo = t.iter().map(|x| x.0).min().unwrap();
        let hi = t.iter().map(|x| x.0 + x.1.max(8)).max().unwrap();
        regions.push(guarded(&mut eng, pd, lo, (hi - lo) as usize, Some(rkey), &mut guards));
    }
    let work_len: usize = msgs.iter().map(|m| m.len.max(8) as usize).sum::<usize>().max(64);
    let work = guarded(&mut eng, pd, WORK_VA, work_len, None, &mut guards);
    let recv = guarded(&mut eng, pd, RECV_VA, RECV_SLOT as usize * 64, None, &mut guards);
    regions.extend([work, recv]);
    let scq = eng.create_cq(4096).unwrap();
    let rcq = eng.create_cq(4096).unwrap();
    let caps = QpCaps { max_send_wr: 256, max_recv_wr: 256, ..QpCaps::default() };
    let qpn = eng.create_qp(pd, scq, rcq, caps).unwrap();
    assert_eq!(qpn, m.qpn);
    let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    eng.modify_qp(qpn, &QpAttr { access: Some(AccessFlags::ALL), ..st(QpState::Init) }).unwrap();
    let recvs = (their_sends + 8).min(64) as u64;
    for i in 0..recvs {
        eng.post_recv(qpn, 1_000 + i, &[Sge { addr: RECV_VA + i * RECV_SLOT, len: RECV_SLOT as u32, lkey: recv.lkey }])
            .unwrap();
    }
    eng.modify_qp(
        qpn,
        &QpAttr {
            path_mtu: Some(cap.mtu),
            dest_qpn: Some(o.qpn),
            rq_psn: Some(o.first_psn.unwrap_or(0)),
            max_dest_rd_atomic: Some(16),
            peer: Some(PeerAddr { ip: wire::IpAddrs::V4 { src: m.ip, dst: o.ip }, mac: o.mac }),
            ..st(QpState::Rtr)
        },
    )
    .unwrap();
    eng.modify_qp(
        qpn,
        &QpAttr {
            sq_psn: Some(m.first_psn.unwrap_or(0)),
            timeout: Some(12),
            retry_cnt: Some(3),
            rnr_retry: Some(3),
            max_rd_atomic: Some(16),
            ..st(QpState::Rts)
        },
    )
    .unwrap();
    Played { eng, qpn, scq, rcq, regions, guards, work, posted: Vec::new(), recvs }
}

impl Played {
    fn post(&mut self, k: usize, m: &Msg) {
        let off = WORK_VA + (k as u64) * u64::from(m.len.max(8));
        if !matches!(m.opcode, WrOpcode::RdmaRead) && !m.opcode.is_atomic() {
            let at = (off - WORK_VA) as usize;
            self.eng.mr_bytes_mut(self.work.lkey).unwrap()[at..at + m.payload.len()].copy_from_slice(&m.payload);
        }
        let mut wr = SendWr::new(k as u64, m.opcode).remote(m.remote_va, m.rkey);
        wr.compare_add = if m.opcode == WrOpcode::AtomicCmpSwp { m.compare } else { m.swap_add };
        wr.swap = m.swap_add;
        if let Some(imm) = m.imm {
            wr.imm = imm;
        }
        let sge = Sge { addr: off, len: m.len, lkey: self.work.lkey };
        self.eng.post_send(self.qpn, &wr, &[sge]).unwrap();
        self.posted.push((k as u64, m.opcode));
    }

    fn guards_intact(&self) -> Result<(), String> {
        for g in &self.guards {
            let b = self.eng.mr_bytes(g.lkey).ok_or("a guard region disappeared")?;
            if b != [GUARD_BYTE; GUARD] {
                let i = b.iter().position(|&x| x != GUARD_BYTE).unwrap_or(0);
                return Err(format!("guard region {:#x} written at byte {i}", g.lkey));
            }
        }
        Ok(())
    }

    /// Every frame the engine has to send now: each must parse with a good ICRC and go to the peer.
    fn drain(&mut self, now: Instant, peer: &End, out: &mut Vec<Vec<u8>>) -> Result<(), String> {
        let mut buf = vec![0u8; 4096 + roce_dp::engine::MAX_HEADER_BYTES];
        let mut n = 0;
        while let Some(len) = self.eng.poll_transmit(now, &mut buf) {
            let f = &buf[..len];
            let p = parse_frame(f).map_err(|e| format!("the engine sent a frame it cannot parse: {e}"))?;
            if !p.icrc_ok || p.repr.bth.dest_qp != peer.qpn || p.repr.eth.dst != peer.mac {
                return Err(format!("the engine sent a bad frame: {:?}", p.repr));
            }
            out.push(f.to_vec());
            n += 1;
            if n > 100_000 {
                return Err("poll_transmit never runs dry".into());
            }
        }
        Ok(())
    }

    fn run_timers(&mut self, until: Instant) -> Instant {
        let mut now = Instant::ZERO;
        while let Some(d) = self.eng.poll_timeout() {
            if d > until {
                break;
            }
            now = d;
            self.eng.handle_timeout(d);
        }
        now
    }
}

// ---------------------------------------------------------------------------------------------------- the mutator

/// Where the fields of an untagged IPv4 RoCE frame (as the captures hold) sit.
struct Layout {
    /// BTH offset.
    bth: usize,
    info: &'static OpInfo,
    /// Payload range.
    payload: core::ops::Range<usize>,
}

const IP: usize = 14;

fn layout(f: &[u8]) -> Option<Layout> {
    if f.len() < IP + 20 + 8 + 12 + 4 || f[12..14] != [8, 0] || f[IP] != 0x45 {
        return None;
    }
    let bth = IP + 20 + 8;
    let info = Opcode(f[bth]).info()?;
    let hdr_end = bth + usize::from(info.hdr_len);
    let pad = usize::from((f[bth + 1] >> 4) & 3);
    let end = f.len().checked_sub(4 + pad)?;
    (hdr_end <= end).then_some(Layout { bth, info, payload: hdr_end..end })
}

/// IPv4 total length, UDP length, IPv4 checksum and ICRC of an untagged IPv4 frame, recomputed from its length.
fn fix(f: &mut [u8]) {
    if f.len() < IP + 20 + 8 + 12 + 4 || f[IP] != 0x45 {
        return;
    }
    let total = (f.len() - IP) as u16;
    f[IP + 2..IP + 4].copy_from_slice(&total.to_be_bytes());
    f[IP + 24..IP + 26].copy_from_slice(&(total - 20).to_be_bytes());
    wire::Ipv4Packet::new_unchecked(&mut f[IP..IP + 20]).fill_checksum();
    let _ = wire::icrc::fill(&mut f[IP..]);
}

/// Keys a mutation may put in a RETH/AtomicETH/IETH: every region's and guard's, neighbours, zero and junk.
struct Dict {
    keys: Vec<u32>,
    /// (va, len) of the regions.
    spans: Vec<(u64, u64)>,
    mtu: u32,
}

impl Dict {
    fn key(&self, rng: &mut SimRng) -> u32 {
        let k = self.keys[rng.below(self.keys.len() as u64) as usize];
        match rng.below(6) {
            0 => k ^ 1,
            1 => k.wrapping_add(0x100),
            2 => rng.next_u64() as u32,
            _ => k,
        }
    }

    fn va(&self, rng: &mut SimRng, old: u64) -> u64 {
        let (va, len) = self.spans[rng.below(self.spans.len() as u64) as usize];
        match rng.below(12) {
            0 => 0,
            1 => u64::MAX - rng.below(8192),
            2 => va + len,
            3 => va + len - 1 - rng.below(8),
            4 => va.wrapping_sub(1 + rng.below(8)),
            5 => va + rng.below(len),
            6 => old ^ (1 << rng.below(64)),
            7 => old.wrapping_add(rng.below(4096)).wrapping_sub(2048),
            8 => rng.next_u64(),
            9 => va + len - 8,
            10 => (1 << 63) | (va & 0xffff),
            _ => old,
        }
    }

    fn len(&self, rng: &mut SimRng, old: u32) -> u32 {
        let m = self.mtu;
        let (_, span) = self.spans[rng.below(self.spans.len() as u64) as usize];
        match rng.below(14) {
            0 => 0,
            1 => 1,
            2 => m - 1,
            3 => m,
            4 => m + 1,
            5 => 1 << 31,
            6 => (1 << 31) - 1,
            7 => (1 << 31) + 1,
            8 => u32::MAX,
            9 => span as u32,
            10 => span as u32 + 1,
            11 => old ^ (1 << rng.below(32)),
            12 => rng.next_u64() as u32,
            _ => old.wrapping_add(rng.below(8) as u32).wrapping_sub(4),
        }
    }
}

fn psn_edge(rng: &mut SimRng, old: u32) -> u32 {
    (match rng.below(9) {
        0 => 0,
        1 => 0xff_ffff,
        2 => old ^ 0x80_0000,
        3 => old.wrapping_add(0x80_0000 - 1),
        4 => old.wrapping_add(1 + rng.below(4) as u32),
        5 => old.wrapping_sub(1 + rng.below(4) as u32),
        6 => old.wrapping_add(rng.below(300) as u32),
        7 => old.wrapping_sub(rng.below(300) as u32),
        _ => rng.next_u64() as u32,
    }) & 0xff_ffff
}

fn put(f: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(d) = f.get_mut(at..at + bytes.len()) {
        d.copy_from_slice(bytes);
    }
}

/// One structure-aware mutation of `f` (lengths and checksums fixed afterwards unless the mutation is about them).
fn mutate(f: &[u8], rng: &mut SimRng, d: &Dict) -> Vec<u8> {
    let mut g = f.to_vec();
    let mut refix = rng.below(10) != 0;
    for _ in 0..1 + rng.below(2) {
        // Each step sees the frame as the previous one left it (a truncated frame takes no further mutation).
        let Some(l) = layout(&g) else { break };
        let b = l.bth;
        match rng.below(21) {
            0 => g[b] = if rng.below(3) == 0 { rng.next_u64() as u8 } else { rng.below(0x1e) as u8 },
            1 => {
                let old = u32::from_be_bytes([0, g[b + 9], g[b + 10], g[b + 11]]);
                put(&mut g, b + 9, &psn_edge(rng, old).to_be_bytes()[1..]);
            }
            2 => {
                let old = u32::from_be_bytes([0, g[b + 5], g[b + 6], g[b + 7]]);
                let q = [old + 1, old.wrapping_sub(1), 0, 0xff_ffff, rng.next_u64() as u32][rng.below(5) as usize];
                put(&mut g, b + 5, &(q & 0xff_ffff).to_be_bytes()[1..]);
            }
            3 => g[b + 8] ^= 0x80,                                            // AckReq
            4 => g[b + 1] ^= [0x80, 0x40][rng.below(2) as usize],             // SE, M
            5 => g[b + 1] = (g[b + 1] & !0x30) | ((rng.below(4) as u8) << 4), // pad count
            6 => g[b + 1] = (g[b + 1] & 0xf0) | (rng.below(16) as u8),        // transport version
            7..=9 if l.info.any(op::RETH) => {
                let r = b + usize::from(l.info.off.reth);
                let va = u64::from_be_bytes(g[r..r + 8].try_into().unwrap());
                let len = u32::from_be_bytes(g[r + 12..r + 16].try_into().unwrap());
                match rng.below(4) {
                    0 => put(&mut g, r, &d.va(rng, va).to_be_bytes()),
                    1 => put(&mut g, r + 12, &d.len(rng, len).to_be_bytes()),
                    2 => put(&mut g, r + 8, &d.key(rng).to_be_bytes()),
                    _ => {
                        put(&mut g, r, &d.va(rng, va).to_be_bytes());
                        put(&mut g, r + 12, &d.len(rng, len).to_be_bytes());
                    }
                }
            }
            10 if l.info.any(op::AETH) => {
                let a = b + usize::from(l.info.off.aeth);
                g[a] = match rng.below(6) {
                    0 => rng.below(32) as u8,        // ACK with credits
                    1 => 0x20 | rng.below(32) as u8, // RNR NAK, every timer
                    2 => 0x60 | rng.below(32) as u8, // NAK codes, reserved ones too
                    3 => 0x40 | rng.below(32) as u8, // reserved
                    _ => rng.next_u64() as u8,
                };
                if rng.below(2) == 0 {
                    put(&mut g, a + 1, &(psn_edge(rng, 0)).to_be_bytes()[1..]);
                }
            }
            11 | 12 if l.info.any(op::ATOMIC_ETH) => {
                let a = b + usize::from(l.info.off.atomic_eth);
                let va = u64::from_be_bytes(g[a..a + 8].try_into().unwrap());
                match rng.below(4) {
                    0 => put(&mut g, a, &(d.va(rng, va) & !7).to_be_bytes()),
                    1 => put(&mut g, a, &d.va(rng, va).to_be_bytes()),
                    2 => put(&mut g, a + 8, &d.key(rng).to_be_bytes()),
                    _ => put(&mut g, a + 12 + 8 * rng.below(2) as usize, &rng.next_u64().to_be_bytes()),
                }
            }
            13 if l.info.any(op::ATOMIC_ACK_ETH) => {
                let a = b + usize::from(l.info.off.atomic_ack_eth);
                put(&mut g, a, &rng.next_u64().to_be_bytes());
            }
            14 if l.info.any(op::IETH | op::IMM_DT) => {
                let a = b + usize::from(if l.info.any(op::IETH) { l.info.off.ieth } else { l.info.off.imm_dt });
                put(&mut g, a, &d.key(rng).to_be_bytes());
            }
            15 | 16 => {
                // Payload length: shorter, longer (one past the MTU, a pad's worth, a whole MTU), or gone.
                let mut p = g[l.payload.clone()].to_vec();
                match rng.below(6) {
                    0 => p.clear(),
                    1 => p.truncate(rng.below(p.len() as u64 + 1) as usize),
                    2 => p.resize(p.len() + 1 + rng.below(4) as usize, 0xee),
                    3 => p.resize(d.mtu as usize + 1, 0xee),
                    4 => p.resize(p.len() + d.mtu as usize, 0xee),
                    _ => p.resize(d.mtu as usize * (1 + rng.below(4) as usize), 0xee),
                }
                let pad = if rng.below(4) == 0 { rng.below(4) as usize } else { (4 - p.len() % 4) % 4 };
                let mut h = g[..l.payload.start].to_vec();
                h[b + 1] = (h[b + 1] & !0x30) | ((pad as u8) << 4);
                h.extend_from_slice(&p);
                h.extend(std::iter::repeat_n(0, pad + 4));
                g = h;
                if g.len() > 4096 + 200 {
                    g.truncate(4096 + 200);
                }
            }
            19 if rng.below(2) == 0 => g[IP + 1] |= 3, // ECN CE (not covered by the ICRC)
            19 => {
                // Turned into a CNP to the same QP (BTH opcode 0x81, BECN, 16 reserved bytes).
                g.truncate(b + 12);
                g[b] = 0x81;
                g[b + 1] &= !0x30;
                g[b + 4] |= 0x40;
                g.extend([0u8; 16 + 4]);
            }
            17 => {
                // Truncated anywhere, lengths left as they were.
                g.truncate(rng.below(g.len() as u64) as usize);
                refix = false;
            }
            18 => {
                // IP total length or UDP length lying (the ICRC recomputed over what is there).
                let at = if rng.below(2) == 0 { IP + 2 } else { IP + 24 };
                let v = u16::from_be_bytes([g[at], g[at + 1]]);
                let v = [v.wrapping_add(4), v.wrapping_sub(4), 0, u16::MAX, v ^ 1][rng.below(5) as usize];
                put(&mut g, at, &v.to_be_bytes());
                wire::Ipv4Packet::new_unchecked(&mut g[IP..IP + 20]).fill_checksum();
                let _ = wire::icrc::fill(&mut g[IP..]);
                refix = false;
            }
            _ => {
                for _ in 0..1 + rng.below(3) {
                    let i = rng.below(g.len() as u64) as usize;
                    g[i] ^= 1 << rng.below(8);
                }
            }
        }
    }
    if refix {
        fix(&mut g);
    }
    g
}

fn trace() -> bool {
    std::env::var_os("ROCE_HOSTILE_TRACE").is_some()
}

fn describe(f: &[u8]) -> String {
    match parse_frame(f) {
        Ok(p) => {
            let b = &p.repr.bth;
            let mut s = format!("{} psn={:#x} qp={:#x}", b.opcode.name(), b.psn.value(), b.dest_qp);
            if let Some(r) = p.repr.ext.reth {
                s += &format!(" reth(va={:#x} rkey={:#x} len={})", r.va, r.rkey, r.len);
            }
            if let Some(a) = p.repr.ext.aeth {
                s += &format!(" aeth(syn={:#x} msn={})", a.syndrome, a.msn);
            }
            if let Some(a) = p.repr.ext.atomic_eth {
                s += &format!(" atomic(va={:#x} rkey={:#x})", a.va, a.rkey);
            }
            format!("{s} +{}B{}", p.payload.len(), if p.icrc_ok { "" } else { " BAD-ICRC" })
        }
        Err(e) => format!("unparsable ({e})"),
    }
}

// ---------------------------------------------------------------------------------------------------- one run

/// What the runs exercised, summed.
#[derive(Default, Debug)]
struct Cover {
    mutated: u64,
    cnps: u64,
    ce: u64,
    drops: u64,
    naks_sent: u64,
    bad_responses: u64,
    success: u64,
    errors: u64,
    qp_err: u64,
}

/// Replays `cap` into an engine playing side `me`, the other side's frames mutated (none if `mutations` is false).
fn run(cap: &Capture, me: usize, seed: u64, mutations: bool, cov: &mut Cover) -> Result<(), String> {
    let mut rng = SimRng::new(seed);
    let mine = messages_of(cap, cap.ends[me].ip);
    let theirs = messages_of(cap, cap.ends[1 - me].ip);
    let their_sends = theirs.iter().filter(|m| matches!(m.opcode, WrOpcode::Send | WrOpcode::SendWithImm)).count();
    // Half the runs with DCQCN on: the CNPs and CE marks the mutations make then move its rate and timers.
    let mut pl = setup(cap, me, &mine, their_sends, mutations && rng.below(2) == 0);
    let peer = cap.ends[1 - me];
    let mut keys: Vec<u32> = pl.regions.iter().chain(&pl.guards).map(|k| k.rkey).collect();
    keys.push(0);
    let dict = Dict { keys, spans: span_list(cap, me, &mine), mtu: cap.mtu };
    let base = Instant(1_000_000_000);
    let mut sent = Vec::new();
    let mut next_msg = 0;
    let mut late: VecDeque<Vec<u8>> = VecDeque::new();
    let mut last = base;
    for (ts, f) in &cap.frames {
        let now = Instant(base.0 + ts);
        let t = pl.run_timers(now);
        if t > last {
            last = t;
        }
        pl.drain(now, &peer, &mut sent)?;
        if src_ip(f) == cap.ends[me].ip {
            while mine.get(next_msg).is_some_and(|m| m.at <= *ts) {
                pl.post(next_msg, &mine[next_msg]);
                next_msg += 1;
            }
        } else {
            let mut batch: Vec<Vec<u8>> = Vec::new();
            if mutations && rng.below(6) == 0 {
                cov.mutated += 1;
                let g = mutate(f, &mut rng, &dict);
                match rng.below(5) {
                    0 => batch.extend([g, f.clone()]), // the mutant, then the real frame
                    1 => batch.extend([f.clone(), g]), // the real frame, then the mutant
                    2 => {
                        batch.push(g);
                        late.push_back(f.clone()); // the real frame arrives late
                    }
                    _ => batch.push(g), // the mutant instead of the real frame
                }
            } else {
                batch.push(f.clone());
            }
            if mutations && rng.below(20) == 0 {
                if let Some(old) = late.pop_front() {
                    batch.push(old);
                }
            }
            for g in batch {
                if trace() {
                    eprintln!("{:>12} -> {}", now.0, describe(&g));
                }
                pl.eng.handle_rx(now, &g, RxMeta::default());
                pl.guards_intact().map_err(|e| format!("after {}: {e}", describe(&g)))?;
                let st = pl.eng.query_qp(pl.qpn).unwrap().state;
                if !matches!(st, QpState::Rts | QpState::Err) {
                    return Err(format!("QP in {st:?} after {}", describe(&g)));
                }
            }
        }
        pl.drain(now, &peer, &mut sent)?;
        last = last.max(now);
    }
    while next_msg < mine.len() {
        pl.post(next_msg, &mine[next_msg]);
        next_msg += 1;
    }
    // The peer goes silent; time runs on until every WR has ended (bounded: retry_cnt and rnr_retry are 3).
    let limit = last + Duration::from_millis(60_000);
    let mut now = last;
    loop {
        pl.drain(now, &peer, &mut sent)?;
        if pl.eng.cq_len(pl.scq) >= pl.posted.len() {
            break;
        }
        match pl.eng.poll_timeout() {
            Some(d) if d <= limit => {
                now = now.max(d);
                pl.eng.handle_timeout(now);
            }
            _ => break,
        }
    }
    pl.guards_intact()?;
    let info = pl.eng.query_qp(pl.qpn).unwrap();
    let mut cqes = Vec::new();
    while let Some(c) = pl.eng.poll_cq_one(pl.scq) {
        cqes.push(c);
    }
    let ids: Vec<u64> = cqes.iter().map(|c| c.wr_id).collect();
    let want: Vec<u64> = pl.posted.iter().map(|p| p.0).collect();
    if ids != want {
        return Err(format!(
            "send completions {ids:?} for WRs {want:?} by {:?} (QP {info:?}, {:?})",
            now,
            pl.eng.qp_counters(pl.qpn)
        ));
    }
    let mut recvs = 0;
    while let Some(c) = pl.eng.poll_cq_one(pl.rcq) {
        recvs += 1;
        if c.status != WcStatus::Success && info.state != QpState::Err {
            return Err(format!("receive completion {c:?} but the QP is {:?}", info.state));
        }
    }
    if recvs > pl.recvs {
        return Err(format!("{recvs} receive completions for {} receive WRs", pl.recvs));
    }
    if let Some(c) = cqes.iter().find(|c| c.status != WcStatus::Success) {
        if info.state != QpState::Err {
            return Err(format!("error completion {c:?} but the QP is {:?}", info.state));
        }
    }
    let st = pl.eng.stats();
    let drops: u64 = st.iter().filter(|(n, _)| n.starts_with("rx_drop")).map(|(_, v)| v).sum();
    let qc = pl.eng.qp_counters(pl.qpn).unwrap();
    if !mutations {
        let ok = cqes.iter().all(|c| c.status == WcStatus::Success);
        if drops != 0 || !ok || info.state != QpState::Rts || qc.bad_responses != 0 {
            return Err(format!("the unmutated replay is not clean: {cqes:?} {st:?} {qc:?} {info:?}"));
        }
    }
    cov.drops += drops;
    cov.cnps += st.rx_cnp;
    cov.ce += qc.ecn_ce_rcvd;
    cov.naks_sent += qc.nak_inv_req_sent + qc.nak_rem_access_sent + qc.nak_rem_op_sent + qc.nak_psn_seq_sent;
    cov.bad_responses += qc.bad_responses;
    cov.success += cqes.iter().filter(|c| c.status == WcStatus::Success).count() as u64;
    cov.errors += cqes.iter().filter(|c| c.status != WcStatus::Success).count() as u64;
    cov.qp_err += u64::from(info.state == QpState::Err);
    Ok(())
}

/// (va, len) of the regions `setup` registers for side `me`, guards included.
fn span_list(cap: &Capture, me: usize, mine: &[Msg]) -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let t = targets(cap, cap.ends[me].ip);
    if !t.is_empty() {
        let lo = t.iter().map(|x| x.0).min().unwrap();
        let hi = t.iter().map(|x| x.0 + x.1.max(8)).max().unwrap();
        v.push((lo, hi - lo));
    }
    let work_len: u64 = mine.iter().map(|m| u64::from(m.len.max(8))).sum::<u64>().max(64);
    v.push((WORK_VA, work_len));
    v.push((RECV_VA, RECV_SLOT * 64));
    for (va, len) in v.clone() {
        v.push((va - GUARD as u64, GUARD as u64));
        v.push((va + len, GUARD as u64));
    }
    v
}

#[test]
fn mutated_rxe_frames_never_break_the_rules() {
    let seeds = Seeds::from_env(0x4057_11e0, 60);
    let caps: Vec<Capture> = CAPTURES.iter().map(|n| load(n)).collect();
    let mut failures = Vec::new();
    let mut cov = Cover::default();
    for cap in &caps {
        for me in 0..2 {
            if !seeds.replaying() {
                run(cap, me, 0, false, &mut cov).unwrap_or_else(|e| panic!("{} side {me}: {e}", cap.name));
            }
            let label = format!("{} side {me}", cap.name);
            failures.extend(seeds.run(&label, 4, |seed| run(cap, me, seed, true, &mut cov)));
        }
    }
    eprintln!("hostile frames: {} iterations per capture and side: {cov:?}", seeds.iters);
    seeded::assert_none(&failures);
    if seeds.iters >= 20 {
        // The mutations reached the deep checks: NAKs, bad responses, error completions, drops.
        assert!(cov.mutated > seeds.iters && cov.drops > 0 && cov.naks_sent > 0 && cov.bad_responses > 0, "{cov:?}");
        assert!(cov.errors > 0 && cov.qp_err > 0 && cov.success > 0 && cov.cnps > 0 && cov.ce > 0, "{cov:?}");
    }
}
