//! The engine fuzzer's machinery (see ../engine_fuzz.rs for what it does and checks), shared with the cargo-fuzz
//! target fuzz/fuzz_targets/engine_ops.rs, which includes this file by path: the randomness comes from a seeded
//! generator ([`Src::seeded`]) or from the fuzzer's input bytes ([`Src::bytes`]).

#![allow(dead_code, unreachable_pub)]

/// Where the fuzzer's choices come from.
pub enum Src {
    /// A seeded generator (the test).
    Seeded(roce_dp::sim::SimRng),
    /// libFuzzer's input, 8 bytes a choice; zeros once it is used up.
    Bytes { data: Vec<u8>, at: usize },
}

impl Src {
    pub fn seeded(seed: u64) -> Src {
        Src::Seeded(roce_dp::sim::SimRng::new(seed))
    }
    pub fn bytes(data: &[u8]) -> Src {
        Src::Bytes { data: data.to_vec(), at: 0 }
    }
    pub fn next_u64(&mut self) -> u64 {
        match self {
            Src::Seeded(r) => r.next_u64(),
            Src::Bytes { data, at } => {
                let mut b = [0u8; 8];
                let rest = data.get(*at..).unwrap_or(&[]);
                let n = rest.len().min(8);
                b[..n].copy_from_slice(&rest[..n]);
                *at += 8;
                u64::from_le_bytes(b)
            }
        }
    }
    /// Uniform-ish in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// The input is used up (always false for the generator).
    pub fn exhausted(&self) -> bool {
        matches!(self, Src::Bytes { data, at } if *at >= data.len())
    }
}

use roce_dp::wire::{
    self, emit_frame, icrc, parse_frame, AethRepr, AtomicEthRepr, IpAddrs, MacAddr, Opcode, Psn, RethRepr, RoceRepr,
};
use roce_dp::{
    AccessFlags, CqId, Duration, Engine, EngineConfig, Instant, LocalIp, MrKeys, Pd, PeerAddr, QpAttr, QpCaps, QpState,
    RxMeta, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};
use std::collections::{HashMap, HashSet, VecDeque};

const MACS: [MacAddr; 2] = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
const IPS: [[u8; 4]; 2] = [[10, 0, 0, 1], [10, 0, 0, 2]];
const IP6S: [[u8; 16]; 2] =
    [[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]];
const BASE: u64 = 0x10_0000;
/// Two pairs' areas of the clean mode (see [`Flow`]); the hostile mode uses the region as one.
const DATA_LEN: usize = 2 * PAIR_AREA;
/// Clean mode, per QP pair in each node's data region: `src` (32 KiB, never written: the source of SENDs and
/// WRITEs and what the peer READs), `wdst` (8 slots of 4 KiB the peer WRITEs), `rdst` (8 slots: READ and atomic
/// results), `recv` (8 receive buffers), and the counter the peer's FetchAdds hit.
const PAIR_AREA: usize = 160 * 1024;
const SRC: u64 = 0;
const WDST: u64 = 32 * 1024;
const RDST: u64 = 64 * 1024;
const RECV: u64 = 96 * 1024;
const COUNTER: u64 = 128 * 1024;
const SLOT: u64 = 4096;
const RO_LEN: usize = 4096;
const GUARD_LEN: usize = 4096;
const FOREIGN_VA: u64 = 0x9000_0000;
const FOREIGN_LEN: usize = 4096;
/// Guards and the foreign region hold only this byte; nothing else the fuzzer writes does.
const GUARD: u8 = 0xa5;
const BUF: usize = 4096 + roce_dp::engine::MAX_HEADER_BYTES;

fn no_guard(b: u8) -> u8 {
    if b == GUARD {
        0x5a
    } else {
        b
    }
}

/// One QP of a node and what the fuzzer expects of it.
#[derive(Default)]
struct Track {
    /// Send WRs taken by post_send and not completed yet: (wr_id, signaled).
    sends: VecDeque<(u64, bool)>,
    /// Receive WRs posted and not completed.
    recvs: VecDeque<u64>,
    /// WRs that may complete once or never (their QP was reset).
    lenient: HashSet<u64>,
    /// An error completion was seen (since the last reset): a success after it on the same queue is wrong.
    send_err_seen: bool,
    recv_err_seen: bool,
    /// Completions seen for this QP.
    cqes: u64,
}

/// What the clean mode expects of one WR.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Send { off: u64, len: u32 },
    Write { slot: u64, off: u64, len: u32 },
    Read { slot: u64, off: u64, len: u32 },
    Add { slot: u64, orig: u64 },
}

/// Clean mode: the data one QP (node `d`, pair `p`) sends its peer, and what must have arrived.
#[derive(Default)]
struct Flow {
    /// An error completion on the pair: its data checks stop (the structural ones go on).
    broken: bool,
    /// WRs in flight by wr_id.
    pending: HashMap<u64, Expect>,
    /// SENDs not yet matched with a receive completion at the peer, in order.
    sends: VecDeque<(u64, u32)>,
    /// Busy slots: wdst (at the peer), rdst (here), recv (at the peer: receives this flow's SENDs land in).
    wdst_busy: [bool; 8],
    rdst_busy: [bool; 8],
    recv_busy: [bool; 8],
    /// Receive WRs posted at the peer for this flow: (wr_id, slot), in order.
    recvs: VecDeque<(u64, u64)>,
    /// The last completed WRITE into each wdst slot: (src offset, length).
    last_write: [Option<(u64, u32)>; 8],
    /// The counter's value after every FetchAdd posted so far (None before the first).
    counter: Option<u64>,
}

struct Node {
    eng: Engine,
    pd: Pd,
    scq: CqId,
    rcq: CqId,
    qpns: [u32; 2],
    data: MrKeys,
    ro: MrKeys,
    guards: [MrKeys; 2],
    foreign: MrKeys,
    /// Keys once valid, now deregistered.
    stale: Vec<u32>,
    /// Per QPN (dead ones too: their CQEs may still sit in the CQ).
    track: HashMap<u32, Track>,
    ro_bytes: Vec<u8>,
}

struct Fuzz {
    rng: Src,
    n: [Node; 2],
    /// Frames in flight: wire[d] goes from node d to node 1 - d.
    wire: [VecDeque<Vec<u8>>; 2],
    now: Instant,
    next_wr: u64,
    mtu: [u32; 2],
    log: Vec<String>,
    /// Per-run hostility: how often (per mille) a value is chosen to be bad rather than valid.
    bad_pm: u64,
    /// Only drops, duplicates, reordering and time: data is checked (flows[pair][requester node]).
    clean: bool,
    /// Clean mode: the data regions are re-registered now and then.
    clean_rereg: bool,
    /// ROCE_FUZZ_TRACE: every frame delivered, every completion.
    trace: bool,
    /// A failure noticed where no error can be returned (reported at the end of the step).
    fault: Option<String>,
    /// Clean mode: completions whose data was checked.
    checked: u64,
    flows: [[Flow; 2]; 2],
    /// CQs of a few entries: completions may be lost to a full CQ (counted), so "exactly once" becomes "at most
    /// once, in order".
    small_cq: bool,
    /// Per pair: IPv6 rather than IPv4 between the nodes.
    v6: [bool; 2],
}

/// Node `from` -> node `1 - from` over IPv4 or IPv6.
fn addrs(from: usize, v6: bool) -> IpAddrs {
    if v6 {
        IpAddrs::V6 { src: IP6S[from], dst: IP6S[1 - from] }
    } else {
        IpAddrs::V4 { src: IPS[from], dst: IPS[1 - from] }
    }
}

fn peer_addr(me: usize, v6: bool) -> PeerAddr {
    PeerAddr { ip: addrs(me, v6), mac: MACS[1 - me] }
}

impl Node {
    fn new(me: usize, dcqcn: bool, knobs: [u64; 3]) -> Node {
        let mut cc = roce_dp::cc::CcConfig::default();
        if dcqcn {
            // A slow line so that pacing holds frames back.
            cc.algorithm = roce_dp::cc::CcAlgorithm::Dcqcn;
            cc.line_rate_mbps = 1000;
        }
        let cfg = EngineConfig {
            cc,
            local_mac: MACS[me],
            local_ip: LocalIp { v4: Some(IPS[me]), v6: Some(IP6S[me]) },
            max_unacked_psns: [64, 1, 2, 8, 256, 1 << 23][knobs[0] as usize % 6],
            ack_req_every: [16, 1, 3, 64][knobs[1] as usize % 4],
            ack: roce_dp::AckPolicy {
                max_pkts: [1, 1, 2, 8][knobs[2] as usize % 4],
                max_delay: Duration::from_nanos([0, 0, 5_000, 100_000][(knobs[2] / 4) as usize % 4]),
            },
            ..EngineConfig::default()
        };
        let mut eng = Engine::new(cfg);
        let pd = eng.alloc_pd();
        let other_pd = eng.alloc_pd();
        let g0 = eng.reg_mr(pd, BASE - GUARD_LEN as u64, GUARD_LEN, AccessFlags::NONE).unwrap();
        let data = eng.reg_mr(pd, BASE, DATA_LEN, AccessFlags::ALL).unwrap();
        let ro = eng.reg_mr(pd, BASE + DATA_LEN as u64, RO_LEN, AccessFlags::REMOTE_READ).unwrap();
        let g1 = eng.reg_mr(pd, BASE + (DATA_LEN + RO_LEN) as u64, GUARD_LEN, AccessFlags::NONE).unwrap();
        let foreign = eng.reg_mr(other_pd, FOREIGN_VA, FOREIGN_LEN, AccessFlags::ALL).unwrap();
        for k in [g0, g1, foreign] {
            eng.mr_bytes_mut(k.lkey).unwrap().fill(GUARD);
        }
        let ro_bytes: Vec<u8> = (0..RO_LEN).map(|i| no_guard((i * 13 + me) as u8)).collect();
        eng.mr_bytes_mut(ro.lkey).unwrap().copy_from_slice(&ro_bytes);
        for (i, b) in eng.mr_bytes_mut(data.lkey).unwrap().iter_mut().enumerate() {
            *b = no_guard((i * 7 + 3) as u8);
        }
        let scq = eng.create_cq(4096).unwrap();
        let rcq = eng.create_cq(4096).unwrap();
        Node {
            eng,
            pd,
            scq,
            rcq,
            qpns: [0; 2],
            data,
            ro,
            guards: [g0, g1],
            foreign,
            stale: Vec::new(),
            track: HashMap::new(),
            ro_bytes,
        }
    }

    fn state(&self, qpn: u32) -> Option<QpState> {
        self.eng.query_qp(qpn).ok().map(|i| i.state)
    }

    fn check_regions(&self) -> Result<(), String> {
        for (name, k) in [("guard0", self.guards[0]), ("guard1", self.guards[1]), ("foreign", self.foreign)] {
            let b = self.eng.mr_bytes(k.lkey).ok_or(format!("{name} region gone"))?;
            if let Some(i) = b.iter().position(|&x| x != GUARD) {
                return Err(format!("{name} region byte {i} changed to {:#x}", b[i]));
            }
        }
        // The read-only region grants a remote right, so a peer's SEND with Invalidate may revoke its keys.
        if let Some(b) = self.eng.mr_bytes(self.ro.lkey) {
            if b != &self.ro_bytes[..] {
                return Err("read-only region changed".into());
            }
        }
        Ok(())
    }
}

/// Frames must parse with a good ICRC and carry no run of guard bytes (a leak of a guard or foreign region).
fn check_tx(frame: &[u8], from: usize) -> Result<(), String> {
    let f = parse_frame(frame).map_err(|e| format!("node {from} sent a frame it cannot parse: {e}"))?;
    if !f.icrc_ok {
        return Err(format!("node {from} sent a bad ICRC"));
    }
    if f.repr.ip.addrs != addrs(from, false) && f.repr.ip.addrs != addrs(from, true) {
        return Err(format!("node {from} sent to {:?}", f.repr.ip.addrs));
    }
    let mut run = 0;
    for &b in f.payload {
        run = if b == GUARD { run + 1 } else { 0 };
        if run >= 16 {
            return Err(format!(
                "node {from} sent {} with guard/foreign bytes in its payload",
                f.repr.bth.opcode.name()
            ));
        }
    }
    Ok(())
}

impl Fuzz {
    fn new(mut rng: Src) -> Fuzz {
        let dcqcn = rng.below(3) == 0;
        let knobs = [rng.below(6), rng.below(4), rng.below(16)];
        let mtu = [256, 512, 1024, 4096][rng.below(4) as usize];
        let mut f = Fuzz {
            rng,
            n: [Node::new(0, dcqcn, knobs), Node::new(1, dcqcn, knobs)],
            wire: [VecDeque::new(), VecDeque::new()],
            now: Instant::ZERO,
            next_wr: 1,
            mtu: [mtu; 2],
            log: Vec::new(),
            bad_pm: 0,
            clean: false,
            clean_rereg: false,
            trace: std::env::var_os("ROCE_FUZZ_TRACE").is_some(),
            fault: None,
            checked: 0,
            flows: Default::default(),
            small_cq: false,
            v6: [false; 2],
        };
        f.v6 = [f.rng.below(3) == 0, f.rng.below(3) == 0];
        f.bad_pm = [10, 50, 200, 600][f.rng.below(4) as usize];
        if f.rng.below(4) == 0 || std::env::var_os("ROCE_FUZZ_CLEAN").is_some() {
            f.clean = true;
            f.bad_pm = 0;
            f.clean_rereg = f.rng.below(3) == 0;
        } else if f.rng.below(8) == 0 {
            f.small_cq = true;
            for n in &mut f.n {
                n.eng.set_cq_depth(n.scq, 2 + f.rng.below(14) as u32);
                n.eng.set_cq_depth(n.rcq, 2 + f.rng.below(14) as u32);
            }
        }
        for i in 0..2 {
            f.create_pair(i);
        }
        if std::env::var_os("ROCE_FUZZ_VERBOSE").is_some() {
            eprintln!(
                "run: clean {} bad {} small_cq {} v6 {:?} mtu {mtu} dcqcn {dcqcn} knobs {knobs:?}",
                f.clean, f.bad_pm, f.small_cq, f.v6
            );
        }
        f
    }

    /// True with the run's hostility.
    fn bad(&mut self) -> bool {
        self.rng.below(1000) < self.bad_pm
    }

    fn rand_psn(&mut self) -> u32 {
        match self.rng.below(4) {
            0 => 0xff_ffff - self.rng.below(8) as u32,
            1 => self.rng.below(8) as u32,
            _ => self.rng.below(1 << 24) as u32,
        }
    }

    fn caps(&mut self) -> QpCaps {
        QpCaps {
            max_send_wr: [4, 16, 64][self.rng.below(3) as usize],
            max_recv_wr: [2, 16, 64][self.rng.below(3) as usize],
            max_send_sge: 1 + self.rng.below(4) as u32,
            max_recv_sge: 1 + self.rng.below(4) as u32,
            max_inline: [0, 64, 256][self.rng.below(3) as usize],
        }
    }

    /// Creates QP `i` on both nodes and connects them (the old ones, if any, are destroyed).
    fn create_pair(&mut self, i: usize) {
        let caps = [self.caps(), self.caps()];
        for (d, caps) in caps.into_iter().enumerate() {
            let old = self.n[d].qpns[i];
            if old != 0 {
                self.destroy(d, old);
            }
            let n = &mut self.n[d];
            let q = n.eng.create_qp(n.pd, n.scq, n.rcq, caps).unwrap();
            n.qpns[i] = q;
            n.track.insert(q, Track::default());
        }
        let psns = [self.rand_psn(), self.rand_psn()];
        let rds = self.rd_pair();
        for d in 0..2 {
            self.bring_up(d, i, psns[d], psns[1 - d], rds[d]);
        }
    }

    fn destroy(&mut self, d: usize, qpn: u32) {
        if self.n[d].eng.destroy_qp(qpn).is_ok() {
            self.log.push(format!("destroy n{d} qp {qpn:#x}"));
            let t = self.n[d].track.get_mut(&qpn).unwrap();
            let pending: Vec<u64> = t.sends.drain(..).map(|s| s.0).chain(t.recvs.drain(..)).collect();
            t.lenient.extend(pending);
        }
    }

    /// Each node's max_rd_atomic and max_dest_rd_atomic for a pair: the same on both (as connection setup makes
    /// them), or, when the run says bad, independent (a requester allowed more than the responder keeps: its
    /// retried READs may find no record and it runs out of retries, an error the application asked for).
    fn rd_pair(&mut self) -> [u8; 2] {
        let a = 1 + self.rng.below(4) as u8;
        if self.bad() {
            [a, 1 + self.rng.below(4) as u8]
        } else {
            [a, a]
        }
    }

    fn bring_up(&mut self, d: usize, i: usize, sq_psn: u32, rq_psn: u32, rd: u8) {
        let dest = self.n[1 - d].qpns[i];
        let timeout = if self.bad() { 1 + self.rng.below(10) as u8 } else { 8 + self.rng.below(6) as u8 };
        let (retry, rnr) = if self.clean { (6, 6) } else { (self.rng.below(4) as u8, self.rng.below(4) as u8) };
        if self.trace {
            eprintln!("bring_up n{d} pair {i}: max_rd_atomic = max_dest_rd_atomic = {rd}");
        }
        let mtu = self.mtu[d];
        let n = &mut self.n[d];
        let q = n.qpns[i];
        let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(mtu),
            dest_qpn: Some(dest),
            rq_psn: Some(rq_psn),
            max_dest_rd_atomic: Some(rd),
            // Clean mode: receive buffers come slower than SENDs at times; an RNR NAK waits ~1 ms then.
            min_rnr_timer: Some(if self.clean { 14 } else { 1 }),
            peer: Some(peer_addr(d, self.v6[i])),
            ..QpAttr::default()
        };
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: Some(timeout),
            retry_cnt: Some(retry),
            rnr_retry: Some(rnr),
            max_rd_atomic: Some(rd),
            ..QpAttr::default()
        };
        for a in [init, rtr, rts] {
            n.eng.modify_qp(q, &a).unwrap_or_else(|e| panic!("bring-up of n{d} qp {q:#x}: {e:?}"));
        }
    }

    fn pump(&mut self) -> Result<(), String> {
        let mut buf = vec![0u8; BUF];
        for d in 0..2 {
            let mut k = 0;
            while let Some(len) = self.n[d].eng.poll_transmit(self.now, &mut buf) {
                check_tx(&buf[..len], d)?;
                self.wire[d].push_back(buf[..len].to_vec());
                if self.wire[d].len() > 512 {
                    self.wire[d].pop_front();
                }
                k += 1;
                if k > 100_000 {
                    return Err(format!("node {d}: poll_transmit never returns None"));
                }
            }
        }
        Ok(())
    }

    fn rx(&mut self, to: usize, frame: &[u8]) {
        if self.trace {
            if let Ok(p) = parse_frame(frame) {
                let b = p.repr.bth;
                eprintln!(
                    "{:?} -> n{to} qp {:#x} {} psn {:#x}{} aeth {:?} reth {:?} +{}",
                    self.now,
                    b.dest_qp,
                    b.opcode.name(),
                    b.psn.value(),
                    if b.ack_req { " A" } else { "" },
                    p.repr.ext.aeth,
                    p.repr.ext.reth,
                    p.payload.len()
                );
            }
        }
        let mut f = frame.to_vec();
        if self.rng.below(2) == 0 {
            self.n[to].eng.handle_rx_mut(self.now, &mut f, RxMeta::default());
            // The frame's buffer is the caller's: handle_rx_mut may work in it but leaves it as it was.
            if f != frame && self.fault.is_none() {
                self.fault = Some(format!("n{to}: handle_rx_mut left the frame changed: {frame:02x?} -> {f:02x?}"));
            }
        } else {
            self.n[to].eng.handle_rx(self.now, &f, RxMeta::default());
        }
    }

    // ------------------------------------------------------------------ hostile values

    /// A remote address near the bounds of the peer's regions, or wrapping.
    fn remote_va(&mut self) -> u64 {
        let r = &mut self.rng;
        let edge = [
            BASE,
            BASE - GUARD_LEN as u64,
            BASE + DATA_LEN as u64,
            BASE + (DATA_LEN + RO_LEN) as u64,
            FOREIGN_VA,
            FOREIGN_VA + FOREIGN_LEN as u64,
            u64::MAX,
            0,
        ][r.below(8) as usize];
        match r.below(4) {
            0 => edge,
            1 => edge.wrapping_sub(1 + r.below(16)),
            2 => edge.wrapping_add(r.below(16)),
            _ => BASE + r.below(DATA_LEN as u64),
        }
    }

    fn len(&mut self) -> u32 {
        let mtu = self.mtu[0].max(self.mtu[1]);
        match self.rng.below(8) {
            0 => 0,
            1 => mtu,
            2 => mtu + 1,
            3 => mtu - 1,
            4 => [u32::MAX, 1 << 31, DATA_LEN as u32, DATA_LEN as u32 + 1][self.rng.below(4) as usize],
            5 => 3 * mtu + self.rng.below(3) as u32,
            _ => self.rng.below(200) as u32,
        }
    }

    /// A key the node's peer holds, one of the node's own, an old one, or made up.
    fn key(&mut self, of: usize) -> u32 {
        let n = &self.n[of];
        let mut keys = vec![n.data.rkey, n.data.rkey, n.data.rkey, n.ro.rkey, n.guards[0].rkey, n.foreign.rkey];
        keys.extend(n.stale.iter().copied());
        match self.rng.below(10) {
            0 => self.rng.next_u64() as u32,
            1 => keys[self.rng.below(keys.len() as u64) as usize] ^ 1,
            _ => keys[self.rng.below(keys.len() as u64) as usize],
        }
    }

    fn sges(&mut self, d: usize, max: u32, write: bool) -> Vec<Sge> {
        let k = if self.bad() { self.rng.below(u64::from(max) + 2) as usize } else { 1 + self.rng.below(2) as usize };
        let mut v = Vec::with_capacity(k);
        for _ in 0..k {
            if !self.bad() {
                let off = self.rng.below(DATA_LEN as u64 / 2);
                // At most 4 x 2 KiB: a receive WR of one valid SGE (8 KiB) holds any valid SEND.
                let l = self.rng.below(2049) as u32;
                v.push(Sge { addr: BASE + off, len: l, lkey: self.n[d].data.lkey });
                continue;
            }
            let n = &self.n[d];
            let (lkey, base, len) = match self.rng.below(12) {
                0 if !write => (n.ro.lkey, BASE + DATA_LEN as u64, RO_LEN),
                1 => (n.foreign.lkey, FOREIGN_VA, FOREIGN_LEN),
                2 => (n.ro.lkey, BASE + DATA_LEN as u64, RO_LEN),
                3 if !n.stale.is_empty() => (n.stale[self.rng.below(n.stale.len() as u64) as usize], BASE, DATA_LEN),
                _ => (n.data.lkey, BASE, DATA_LEN),
            };
            let (addr, l) = match self.rng.below(6) {
                0 => (base + len as u64 - self.rng.below(64), self.rng.below(128) as u32),
                1 => (base.wrapping_sub(self.rng.below(8)), self.rng.below(64) as u32),
                2 => (base, len as u32 + self.rng.below(2) as u32),
                3 => (u64::MAX - self.rng.below(8), 16),
                _ => (base + self.rng.below(len as u64 / 2), self.len().min(len as u32 / 2)),
            };
            v.push(Sge { addr, len: l, lkey });
        }
        v
    }

    // ------------------------------------------------------------------ actions

    fn post_send(&mut self, d: usize) {
        let i = self.rng.below(2) as usize;
        let q = self.n[d].qpns[i];
        let mut opc = WrOpcode::ALL[self.rng.below(8) as usize];
        if opc == WrOpcode::SendWithInv && !self.bad() {
            opc = WrOpcode::Send;
        }
        let id = self.next_wr;
        self.next_wr += 1;
        let (va, rkey) = if self.bad() {
            (self.remote_va(), self.key(1 - d))
        } else {
            (BASE + (self.rng.below(DATA_LEN as u64 / 2) & !7), self.n[1 - d].data.rkey)
        };
        let mut wr = SendWr::new(id, opc).remote(va, rkey);
        wr.signaled = self.rng.below(4) != 0;
        wr.fence = self.rng.below(8) == 0;
        let k = self.n[1 - d].data.rkey;
        let inv = if self.bad() { self.key(1 - d) } else { k ^ 0xff };
        wr.solicited = self.rng.below(4) == 0;
        wr.imm = self.rng.next_u64() as u32;
        wr.invalidate_rkey = inv;
        wr.compare_add = self.rng.next_u64();
        wr.swap = self.rng.next_u64();
        if opc.is_atomic() && self.rng.below(2) == 0 {
            wr.remote_addr &= !7;
        }
        let res = if !opc.is_rd_atomic() && self.rng.below(5) == 0 {
            let n = if self.bad() { self.len().min(300) } else { self.rng.below(65) as u32 } as usize;
            let data: Vec<u8> = (0..n).map(|_| no_guard(self.rng.next_u64() as u8)).collect();
            wr.inline = true;
            self.n[d].eng.post_send_inline(q, &wr, &data)
        } else {
            let sgl = if opc.is_atomic() && !self.bad() {
                let at = BASE + DATA_LEN as u64 / 2 + (self.rng.below(64) & !7);
                vec![Sge { addr: at, len: 8, lkey: self.n[d].data.lkey }]
            } else {
                self.sges(d, 4, opc.is_rd_atomic())
            };
            self.n[d].eng.post_send(q, &wr, &sgl)
        };
        self.log.push(format!("post_send n{d} qp {q:#x} wr {id} {opc:?} -> {res:?}"));
        if std::env::var_os("ROCE_FUZZ_TRACE").is_some() {
            eprintln!("{} {:?}", self.log.last().unwrap(), self.n[d].state(q));
        }
        if res.is_ok() {
            self.n[d].track.get_mut(&q).unwrap().sends.push_back((id, wr.signaled));
        }
    }

    fn post_recv(&mut self, d: usize) {
        let i = self.rng.below(2) as usize;
        let q = self.n[d].qpns[i];
        let id = self.next_wr;
        self.next_wr += 1;
        let sgl = if self.bad() {
            self.sges(d, 4, true)
        } else {
            vec![Sge { addr: BASE + DATA_LEN as u64 / 2, len: DATA_LEN as u32 / 2, lkey: self.n[d].data.lkey }]
        };
        let res = self.n[d].eng.post_recv(q, id, &sgl);
        if res.is_ok() {
            self.n[d].track.get_mut(&q).unwrap().recvs.push_back(id);
        }
    }

    /// A frame to node `to` built from nothing: any opcode, a PSN near what the QP expects, random headers.
    fn fabricate(&mut self, to: usize) -> Vec<u8> {
        let i = self.rng.below(2) as usize;
        let q = self.n[to].qpns[i];
        let info = self.n[to].eng.query_qp(q).ok();
        let r = &mut self.rng;
        let opc = match r.below(16) {
            0 => Opcode(r.next_u64() as u8),
            // CNP, UC and UD opcodes.
            1 => Opcode([0x81, 0x20, 0x24, 0x2a, 0x64, 0x65][r.below(6) as usize]),
            _ => Opcode(r.below(0x19) as u8),
        };
        let base = match (info, r.below(2)) {
            (Some(x), 0) => x.rq_psn,
            (Some(x), _) => x.sq_psn,
            (None, _) => 0,
        };
        let psn = match r.below(6) {
            0 => base,
            1 => base.wrapping_sub(1 + r.below(4) as u32),
            2 => base.wrapping_add(r.below(4) as u32),
            3 => base.wrapping_sub(64 + r.below(3) as u32),
            4 => base.wrapping_add(1 << 23),
            _ => r.next_u64() as u32,
        } & 0xff_ffff;
        let v6 = if r.below(8) == 0 { r.below(2) == 0 } else { self.v6[i] };
        let mut repr = base_repr(to, q, v6);
        repr.bth.opcode = opc;
        repr.bth.psn = Psn::new(psn);
        repr.bth.ack_req = r.below(2) == 0;
        repr.bth.solicited = r.below(4) == 0;
        repr.bth.becn = r.below(4) == 0;
        repr.ip.ecn = [wire::Ecn::NotEct, wire::Ecn::Ect0, wire::Ecn::Ce][r.below(3) as usize];
        let va = self.remote_va();
        let len = self.len();
        let key = self.key(to);
        let r = &mut self.rng;
        repr.ext.reth = Some(RethRepr { va, rkey: key, len });
        let syn = match r.below(4) {
            0 => 0x1f,
            1 => 0x60 | r.below(6) as u8,
            2 => 0x20 | r.below(32) as u8,
            _ => r.next_u64() as u8,
        };
        let msn = match r.below(3) {
            0 => r.below(4) as u32,
            1 => 0xff_ffff - r.below(4) as u32,
            _ => r.next_u64() as u32 & 0xff_ffff,
        };
        repr.ext.aeth = Some(AethRepr { syndrome: syn, msn });
        repr.ext.atomic_eth =
            Some(AtomicEthRepr { va: va & !7, rkey: key, swap_add: r.next_u64(), compare: r.next_u64() });
        repr.ext.atomic_ack = Some(r.next_u64());
        repr.ext.imm = Some(r.next_u64() as u32);
        repr.ext.ieth = Some(key);
        let plen = self.len().min(4096) as usize;
        let payload: Vec<u8> = (0..plen).map(|_| no_guard(self.rng.next_u64() as u8)).collect();
        self.emit(&repr, &payload)
    }

    fn emit(&mut self, repr: &RoceRepr, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; BUF + 64];
        let payload = if opcode_has_payload(repr.bth.opcode) { payload } else { &[] };
        let n = match emit_frame(&mut buf, repr, payload.len(), |b| b.copy_from_slice(payload)) {
            Ok(n) => n,
            // An opcode outside the table cannot be emitted: emit as SEND_ONLY and patch the opcode byte.
            Err(_) => {
                let mut r2 = *repr;
                r2.bth.opcode = Opcode::RC_SEND_ONLY;
                let n = emit_frame(&mut buf, &r2, payload.len(), |b| b.copy_from_slice(payload)).unwrap();
                buf[bth_at(repr)] = repr.bth.opcode.0;
                icrc::fill(&mut buf[14..n]).unwrap();
                n
            }
        };
        buf.truncate(n);
        if self.rng.below(10) == 0 {
            // A pad count other than the one the payload needs, ICRC valid.
            buf[bth_at(repr) + 1] ^= (1 + self.rng.below(3) as u8) << 4;
            icrc::fill(&mut buf[14..]).unwrap();
        }
        buf
    }

    /// The frame `raw` with one header field or the payload changed, emitted again with a valid ICRC.
    fn mutate(&mut self, raw: &[u8]) -> Vec<u8> {
        if self.rng.below(10) == 0 {
            let mut v = raw.to_vec();
            let i = self.rng.below(v.len() as u64) as usize;
            v[i] ^= 1 << self.rng.below(8);
            return v;
        }
        let Ok(f) = parse_frame(raw) else { return raw.to_vec() };
        let mut repr = f.repr;
        let mut payload = f.payload.to_vec();
        let rounds = 1 + self.rng.below(3);
        for _ in 0..rounds {
            let r = &mut self.rng;
            match r.below(13) {
                0 => repr.bth.opcode = Opcode(r.below(0x19) as u8),
                1 => {
                    let d = [1u32, 2, 63, 64, 65, 1 << 23, (1 << 23) + 1, 0xff_ffff][r.below(8) as usize];
                    let p = if r.below(2) == 0 { repr.bth.psn.add(d) } else { repr.bth.psn.sub(d) };
                    repr.bth.psn = p;
                }
                2 => repr.bth.ack_req = !repr.bth.ack_req,
                3 => {
                    let va = self.remote_va();
                    let len = self.len();
                    let r = &mut self.rng;
                    let mut x = repr.ext.reth.unwrap_or_default();
                    match r.below(3) {
                        0 => x.va = va,
                        1 => x.len = len,
                        _ => x.rkey ^= 1 << r.below(32),
                    }
                    repr.ext.reth = Some(x);
                }
                4 => {
                    let mut a = repr.ext.aeth.unwrap_or(AethRepr { syndrome: 0x1f, msn: 0 });
                    if r.below(2) == 0 {
                        a.syndrome = [0x1f, 0x00, 0x20, 0x3f, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x7f, 0x40, 0xff]
                            [r.below(13) as usize];
                    } else {
                        a.msn = match r.below(3) {
                            0 => a.msn.wrapping_add(1) & 0xff_ffff,
                            1 => a.msn.wrapping_sub(1) & 0xff_ffff,
                            _ => r.next_u64() as u32 & 0xff_ffff,
                        };
                    }
                    repr.ext.aeth = Some(a);
                }
                5 => repr.ext.atomic_ack = Some(r.next_u64()),
                6 => payload.truncate(r.below(payload.len() as u64 + 1) as usize),
                7 => {
                    let to =
                        [0usize, 1, 3, 4097, 4096, payload.len() + 1, self.mtu[0] as usize + 1][r.below(7) as usize];
                    payload.resize(to.min(4096), 0x11);
                }
                8 => repr.bth.dest_qp = [repr.bth.dest_qp ^ 1, r.next_u64() as u32 & 0xff_ffff, 0][r.below(3) as usize],
                9 => {
                    let mut a =
                        repr.ext.atomic_eth.unwrap_or(AtomicEthRepr { va: 0, rkey: 0, swap_add: 0, compare: 0 });
                    a.va = if r.below(2) == 0 { a.va ^ (1 << r.below(64)) } else { a.va.wrapping_add(r.below(9)) };
                    repr.ext.atomic_eth = Some(a);
                }
                10 => {
                    let f = repr.bth.opcode.0;
                    // Same message position, other kind (SEND <-> WRITE <-> READ response).
                    repr.bth.opcode = Opcode(f ^ [0x06, 0x0d, 0x10][r.below(3) as usize]);
                }
                11 => repr.ip.ecn = wire::Ecn::Ce,
                _ => repr.bth.solicited = !repr.bth.solicited,
            }
        }
        // A header the new opcode needs and the old lacked: made up.
        let va = self.remote_va();
        let len = self.len();
        repr.ext.reth.get_or_insert(RethRepr { va, rkey: 0, len });
        repr.ext.aeth.get_or_insert(AethRepr { syndrome: 0x1f, msn: 1 });
        repr.ext.atomic_eth.get_or_insert(AtomicEthRepr { va: va & !7, rkey: 0, swap_add: 1, compare: 0 });
        repr.ext.atomic_ack.get_or_insert(7);
        repr.ext.imm.get_or_insert(0x1234);
        repr.ext.ieth.get_or_insert(0);
        self.emit(&repr, &payload)
    }

    fn modify(&mut self, d: usize) {
        let i = self.rng.below(2) as usize;
        let q = self.n[d].qpns[i];
        let r = &mut self.rng;
        let states =
            [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err];
        let mut a = QpAttr { state: Some(states[r.below(7) as usize]), ..QpAttr::default() };
        if r.below(3) == 0 {
            a.state = None;
        }
        if r.below(4) == 0 {
            a.path_mtu = Some([256, 512, 1024, 2048, 4096, 100][r.below(6) as usize]);
        }
        if r.below(4) == 0 {
            a.sq_psn = Some(r.below(1 << 24) as u32);
        }
        if r.below(4) == 0 {
            a.rq_psn = Some(r.below(1 << 24) as u32);
        }
        if r.below(4) == 0 {
            a.timeout = Some(1 + r.below(12) as u8);
        }
        if r.below(4) == 0 {
            a.retry_cnt = Some(r.below(7) as u8);
        }
        if r.below(4) == 0 {
            a.rnr_retry = Some(r.below(7) as u8);
        }
        if r.below(4) == 0 {
            a.max_rd_atomic = Some(r.below(17) as u8);
        }
        if r.below(4) == 0 {
            a.max_dest_rd_atomic = Some(r.below(17) as u8);
        }
        if r.below(4) == 0 {
            a.access = Some(AccessFlags(r.below(16) as u32));
        }
        if r.below(6) == 0 {
            a.min_rnr_timer = Some(r.below(32) as u8);
        }
        if r.below(6) == 0 {
            a.dest_qpn = Some(r.below(1 << 24) as u32);
        }
        if a.state == Some(QpState::Rtr) {
            a.peer = Some(peer_addr(d, self.v6[i]));
            a.path_mtu.get_or_insert(self.mtu[d]);
            a.dest_qpn.get_or_insert(self.n[1 - d].qpns[i]);
            a.rq_psn.get_or_insert(0);
        }
        let res = self.n[d].eng.modify_qp(q, &a);
        self.log.push(format!("modify n{d} qp {q:#x} {:?} -> {res:?}", a.state));
        if res.is_ok() && a.state == Some(QpState::Reset) {
            self.reset_track(d, q);
        }
    }

    /// Pair `i` not both in RTS: both QPs through RESET and up again with new PSNs (frames of the old connection
    /// may still be on the wire).
    fn revive(&mut self, i: usize) {
        let qs = [self.n[0].qpns[i], self.n[1].qpns[i]];
        if (0..2).all(|d| self.n[d].state(qs[d]) == Some(QpState::Rts)) {
            return;
        }
        for (d, &q) in qs.iter().enumerate() {
            let reset = QpAttr { state: Some(QpState::Reset), ..QpAttr::default() };
            self.n[d].eng.modify_qp(q, &reset).unwrap_or_else(|e| panic!("reset of n{d} qp {q:#x}: {e:?}"));
            self.reset_track(d, q);
        }
        let psns = [self.rand_psn(), self.rand_psn()];
        let rds = self.rd_pair();
        for d in 0..2 {
            self.bring_up(d, i, psns[d], psns[1 - d], rds[d]);
        }
        self.log.push(format!("revive pair {i}"));
    }

    fn reset_track(&mut self, d: usize, q: u32) {
        let t = self.n[d].track.get_mut(&q).unwrap();
        let pending: Vec<u64> = t.sends.drain(..).map(|s| s.0).chain(t.recvs.drain(..)).collect();
        t.lenient.extend(pending);
        t.send_err_seen = false;
        t.recv_err_seen = false;
    }

    fn rereg(&mut self, d: usize) {
        let n = &mut self.n[d];
        let old = n.data;
        // (None: a peer's SEND with Invalidate revoked the keys; the slot is still there to deregister.)
        let bytes = n.eng.mr_bytes(old.lkey).map_or_else(|| vec![0x11; DATA_LEN], |b| b.to_vec());
        assert!(n.eng.dereg_mr(old.lkey));
        n.stale.push(old.lkey);
        n.data = n.eng.reg_mr(n.pd, BASE, DATA_LEN, AccessFlags::ALL).unwrap();
        n.eng.mr_bytes_mut(n.data.lkey).unwrap().copy_from_slice(&bytes);
        self.log.push(format!("rereg n{d} data {:#x} -> {:#x}", old.lkey, n.data.lkey));
    }

    fn poll(&mut self, d: usize) -> Result<(), String> {
        let mut seen = Vec::new();
        let n = &mut self.n[d];
        for cq in [n.scq, n.rcq] {
            while let Some(c) = n.eng.poll_cq_one(cq) {
                let state = n.eng.query_qp(c.qpn).ok().map(|i| i.state);
                let t = n.track.get_mut(&c.qpn).ok_or(format!("n{d}: CQE for unknown QP {c:?}"))?;
                t.cqes += 1;
                if c.status != WcStatus::Success
                    && c.status != WcStatus::WrFlushErr
                    && std::env::var_os("ROCE_FUZZ_VERBOSE").is_some()
                {
                    eprintln!("  n{d} qp {:#x} {:?} {:?}", c.qpn, c.opcode, c.status);
                }
                let recv = matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
                if (cq == n.rcq) != recv && c.status == WcStatus::Success {
                    return Err(format!("n{d}: CQE on the wrong CQ: {c:?}"));
                }
                if t.lenient.remove(&c.wr_id) {
                    continue;
                }
                if recv || (cq == n.rcq) {
                    match t.recvs.iter().position(|&w| w == c.wr_id) {
                        Some(0) => drop(t.recvs.pop_front()),
                        Some(k) if self.small_cq => drop(t.recvs.drain(..=k)),
                        _ => {
                            return Err(format!(
                                "n{d}: receive CQE out of order or unknown: {c:?}, posted {:?}",
                                t.recvs
                            ))
                        }
                    }
                    if c.status != WcStatus::Success {
                        t.recv_err_seen = true;
                    } else if t.recv_err_seen {
                        return Err(format!("n{d}: receive success after an error: {c:?}"));
                    }
                } else {
                    let Some(pos) = t.sends.iter().position(|s| s.0 == c.wr_id) else {
                        return Err(format!(
                            "n{d}: send CQE for a WR not outstanding: {c:?}, outstanding {:?}",
                            t.sends
                        ));
                    };
                    if let Some(&(w, _)) = t.sends.iter().take(pos).find(|s| s.1 && !self.small_cq) {
                        return Err(format!("n{d}: send CQE {c:?} before the signaled WR {w} posted earlier"));
                    }
                    t.sends.drain(..=pos);
                    if c.status != WcStatus::Success {
                        t.send_err_seen = true;
                    } else if t.send_err_seen {
                        return Err(format!("n{d}: send success after an error: {c:?}"));
                    }
                }
                if c.status != WcStatus::Success && state.is_some() && state != Some(QpState::Err) {
                    return Err(format!("n{d}: error completion {c:?} with the QP in {state:?}"));
                }
                seen.push((c, recv || cq == n.rcq));
                if self.trace {
                    eprintln!("{:?} n{d} CQE {c:?}", self.now);
                }
            }
        }
        if self.clean {
            for (c, recv) in seen {
                self.clean_cqe(d, &c, recv)?;
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ clean mode

    fn pair_of(&self, d: usize, qpn: u32) -> Option<usize> {
        self.n[d].qpns.iter().position(|&q| q == qpn)
    }

    fn area(p: usize) -> u64 {
        BASE + (p * PAIR_AREA) as u64
    }

    fn bytes(&self, d: usize, va: u64, len: u32) -> Vec<u8> {
        let n = &self.n[d];
        let b = n.eng.mr_bytes(n.data.lkey).expect("clean mode: the data region stays");
        let off = (va - BASE) as usize;
        b[off..off + len as usize].to_vec()
    }

    /// A WR whose data can be checked: SEND or WRITE from `src`, READ of the peer's `src`, FetchAdd on the peer's
    /// counter; one SGE, a free slot.
    fn clean_post_send(&mut self, d: usize) {
        let p = self.rng.below(2) as usize;
        let q = self.n[d].qpns[p];
        let slot = self.rng.below(8);
        let len = match self.rng.below(4) {
            0 => self.rng.below(65) as u32,
            1 => self.mtu[d] * (1 + self.rng.below(3) as u32) + self.rng.below(3) as u32 - 1,
            _ => self.rng.below(SLOT + 1) as u32,
        }
        .min(SLOT as u32);
        let off = self.rng.below(32 * 1024 - u64::from(len) + 1);
        let (me, peer) = (Self::area(p), Self::area(p));
        let lkey = self.n[d].data.lkey;
        let rkey = self.n[1 - d].data.rkey;
        let id = self.next_wr;
        let f = &self.flows[p][d];
        let (wr, sge, e) = match self.rng.below(4) {
            0 if !f.wdst_busy[slot as usize] => (
                SendWr::new(id, WrOpcode::RdmaWrite).remote(peer + WDST + slot * SLOT, rkey),
                Sge { addr: me + SRC + off, len, lkey },
                Expect::Write { slot, off, len },
            ),
            1 if !f.rdst_busy[slot as usize] => (
                SendWr::new(id, WrOpcode::RdmaRead).remote(peer + SRC + off, rkey),
                Sge { addr: me + RDST + slot * SLOT, len, lkey },
                Expect::Read { slot, off, len },
            ),
            2 if !f.rdst_busy[slot as usize] => {
                let add = self.rng.below(1000) + 1;
                let now = match f.counter {
                    Some(v) => v,
                    None => u64::from_le_bytes(self.bytes(1 - d, peer + COUNTER, 8).try_into().unwrap()),
                };
                let mut wr = SendWr::new(id, WrOpcode::AtomicFetchAdd).remote(peer + COUNTER, rkey);
                wr.compare_add = add;
                self.flows[p][d].counter = Some(now.wrapping_add(add));
                (wr, Sge { addr: me + RDST + slot * SLOT, len: 8, lkey }, Expect::Add { slot, orig: now })
            }
            _ => (SendWr::new(id, WrOpcode::Send), Sge { addr: me + SRC + off, len, lkey }, Expect::Send { off, len }),
        };
        let res = self.n[d].eng.post_send(q, &wr, &[sge]);
        self.log.push(format!("clean post_send n{d} qp {q:#x} wr {id} {e:?} -> {res:?}"));
        if res.is_err() {
            if let Expect::Add { orig, .. } = e {
                self.flows[p][d].counter = Some(orig);
            }
            return;
        }
        self.next_wr += 1;
        self.n[d].track.get_mut(&q).unwrap().sends.push_back((id, true));
        let f = &mut self.flows[p][d];
        match e {
            Expect::Write { slot, .. } => f.wdst_busy[slot as usize] = true,
            Expect::Read { slot, .. } | Expect::Add { slot, .. } => f.rdst_busy[slot as usize] = true,
            Expect::Send { off, len } => f.sends.push_back((off, len)),
        }
        f.pending.insert(id, e);
    }

    /// A receive WR at node `d` for the SENDs of its peer on pair `p`: one free 4 KiB buffer.
    fn clean_post_recv(&mut self, d: usize) {
        let p = self.rng.below(2) as usize;
        let q = self.n[d].qpns[p];
        let slot = self.rng.below(8);
        if self.flows[p][1 - d].recv_busy[slot as usize] {
            return;
        }
        let id = self.next_wr;
        let sge = Sge { addr: Self::area(p) + RECV + slot * SLOT, len: SLOT as u32, lkey: self.n[d].data.lkey };
        if self.n[d].eng.post_recv(q, id, &[sge]).is_ok() {
            self.next_wr += 1;
            self.n[d].track.get_mut(&q).unwrap().recvs.push_back(id);
            let f = &mut self.flows[p][1 - d];
            f.recv_busy[slot as usize] = true;
            f.recvs.push_back((id, slot));
        }
    }

    /// The data checks of one completion at node `d`.
    fn clean_cqe(&mut self, d: usize, c: &roce_dp::Cqe, recv: bool) -> Result<(), String> {
        let Some(p) = self.pair_of(d, c.qpn) else { return Ok(()) };
        if c.status != WcStatus::Success {
            self.flows[p][0].broken = true;
            self.flows[p][1].broken = true;
        }
        let (me, peer) = (Self::area(p), Self::area(p));
        if recv {
            // A SEND of the peer (flow [p][1 - d]) arrived here.
            let f = &mut self.flows[p][1 - d];
            let Some((id, slot)) = f.recvs.pop_front() else {
                return Err(format!("n{d}: receive CQE {c:?} with no receive posted"));
            };
            f.recv_busy[slot as usize] = false;
            if id != c.wr_id {
                return Err(format!("n{d}: receive CQE {c:?}, expected wr {id}"));
            }
            if f.broken {
                return Ok(());
            }
            let Some((off, len)) = f.sends.pop_front() else {
                return Err(format!("n{d}: receive CQE {c:?} for a SEND never posted"));
            };
            if c.byte_len != len {
                return Err(format!("n{d}: receive of {} bytes for a SEND of {len}: {c:?}", c.byte_len));
            }
            let got = self.bytes(d, me + RECV + slot * SLOT, len);
            let sent = self.bytes(1 - d, peer + SRC + off, len);
            if got != sent {
                return Err(format!("n{d}: SEND of {len} bytes from offset {off} arrived different: {c:?}"));
            }
            self.checked += 1;
            return Ok(());
        }
        let f = &mut self.flows[p][d];
        let Some(e) = f.pending.remove(&c.wr_id) else { return Ok(()) };
        match e {
            Expect::Write { slot, .. } => f.wdst_busy[slot as usize] = false,
            Expect::Read { slot, .. } | Expect::Add { slot, .. } => f.rdst_busy[slot as usize] = false,
            Expect::Send { .. } => {}
        }
        if f.broken || c.status != WcStatus::Success {
            return Ok(());
        }
        match e {
            Expect::Write { slot, off, len } => {
                f.last_write[slot as usize] = Some((off, len));
                let there = self.bytes(1 - d, peer + WDST + slot * SLOT, len);
                if there != self.bytes(d, me + SRC + off, len) {
                    return Err(format!(
                        "n{d}: WRITE wr {} of {len} bytes completed, the peer holds other bytes",
                        c.wr_id
                    ));
                }
            }
            Expect::Read { slot, off, len } => {
                if self.bytes(d, me + RDST + slot * SLOT, len) != self.bytes(1 - d, peer + SRC + off, len) {
                    return Err(format!("n{d}: READ wr {} of {len} bytes completed with other bytes", c.wr_id));
                }
            }
            Expect::Add { slot, orig } => {
                let got = u64::from_le_bytes(self.bytes(d, me + RDST + slot * SLOT, 8).try_into().unwrap());
                if got != orig {
                    return Err(format!(
                        "n{d}: FetchAdd wr {} returned {got:#x}, expected {orig:#x} (executed twice or lost?)",
                        c.wr_id
                    ));
                }
            }
            Expect::Send { .. } => {}
        }
        self.checked += 1;
        Ok(())
    }

    /// After settling: the last WRITE into each slot is what the slot holds (no late duplicate re-executed an
    /// older one), each counter is what the FetchAdds add up to, and every SEND posted was received.
    fn clean_final(&self) -> Result<(), String> {
        for p in 0..2 {
            for d in 0..2 {
                let f = &self.flows[p][d];
                if f.broken || !f.pending.is_empty() {
                    continue;
                }
                let (me, peer) = (Self::area(p), Self::area(p));
                for (slot, w) in f.last_write.iter().enumerate() {
                    if let Some((off, len)) = *w {
                        if self.bytes(1 - d, peer + WDST + slot as u64 * SLOT, len)
                            != self.bytes(d, me + SRC + off, len)
                        {
                            return Err(format!("n{d} pair {p}: wdst slot {slot} no longer holds the last WRITE"));
                        }
                    }
                }
                if let Some(v) = f.counter {
                    let got = u64::from_le_bytes(self.bytes(1 - d, peer + COUNTER, 8).try_into().unwrap());
                    if got != v {
                        return Err(format!("n{d} pair {p}: counter {got:#x} after the FetchAdds, expected {v:#x}"));
                    }
                }
            }
        }
        Ok(())
    }

    fn advance(&mut self) -> Result<(), String> {
        let r = &mut self.rng;
        let next = [self.n[0].eng.poll_timeout(), self.n[1].eng.poll_timeout()].into_iter().flatten().min();
        let jump = if self.clean { r.below(60) } else { r.below(20) };
        self.now = match (jump, next) {
            (0..=2, Some(t)) if t > self.now => t,
            (3, _) => self.now + Duration::from_nanos(r.below(100_000_000)),
            (4 | 5, _) => self.now + Duration::from_nanos(r.below(200_000)),
            _ => self.now + Duration::from_nanos(r.below(2_000)),
        };
        for d in 0..2 {
            self.timeout_at_now(d)?;
        }
        Ok(())
    }

    /// `handle_timeout(now)`, and then the engine's next deadline is in the future (or none): a deadline that stays
    /// at or before `now` after the timers ran there would make a worker loop spin.
    fn timeout_at_now(&mut self, d: usize) -> Result<(), String> {
        self.n[d].eng.handle_timeout(self.now);
        match self.n[d].eng.poll_timeout() {
            Some(t) if t <= self.now => {
                Err(format!("n{d}: after handle_timeout({:?}) the next deadline is {t:?}", self.now))
            }
            _ => Ok(()),
        }
    }

    fn step(&mut self) -> Result<(), String> {
        if self.clean {
            self.clean_step()?;
        } else {
            self.hostile_step()?;
        }
        self.fault.take().map_or(Ok(()), Err)
    }

    fn hostile_step(&mut self) -> Result<(), String> {
        let d = self.rng.below(2) as usize;
        match self.rng.below(100) {
            0..=24 => {
                if let Some(f) = self.wire[d].pop_front() {
                    self.rx(1 - d, &f);
                }
            }
            25..=34 if self.bad() => {
                if let Some(f) = self.wire[d].pop_front() {
                    let m = self.mutate(&f);
                    self.rx(1 - d, &m);
                    if self.rng.below(3) == 0 {
                        self.rx(1 - d, &f);
                    }
                }
            }
            35..=37 => self.mischief(d),
            38..=45 if self.bad() => {
                let f = self.fabricate(1 - d);
                self.rx(1 - d, &f);
            }
            46..=62 => self.post_send(d),
            63..=71 => self.post_recv(d),
            72..=81 => self.advance()?,
            82..=84 if self.bad() => self.modify(d),
            85 => {
                let i = self.rng.below(2) as usize;
                if self.rng.below(4) == 0 {
                    self.create_pair(i);
                } else {
                    self.revive(i);
                }
            }
            86 => {
                if self.rng.below(3) == 0 {
                    self.rereg(d);
                } else {
                    // A CQ its QPs still use cannot go.
                    let n = &mut self.n[d];
                    let cq = if self.rng.below(2) == 0 { n.scq } else { n.rcq };
                    if n.eng.destroy_cq(cq).is_ok() {
                        return Err(format!("n{d}: destroy_cq of a CQ in use by QPs succeeded"));
                    }
                }
            }
            25..=45 => {
                if let Some(f) = self.wire[d].pop_front() {
                    self.rx(1 - d, &f);
                }
            }
            _ => self.poll(d)?,
        }
        self.pump()?;
        if self.rng.below(8) == 0 {
            self.n[d].check_regions()?;
        }
        Ok(())
    }

    /// What a lossy network does to the frames from node `d`: drop the next, deliver it twice (a copy now), or
    /// swap it with a later one.
    fn mischief(&mut self, d: usize) {
        match self.rng.below(3) {
            0 => drop(self.wire[d].pop_front()),
            1 => {
                if let Some(f) = self.wire[d].front().cloned() {
                    self.rx(1 - d, &f);
                }
            }
            _ => {
                let l = self.wire[d].len();
                if l > 1 {
                    let j = self.rng.below(l as u64) as usize;
                    self.wire[d].swap(0, j);
                }
            }
        }
    }

    /// A step of the clean mode: the wire only drops, duplicates and reorders.
    fn clean_step(&mut self) -> Result<(), String> {
        let d = self.rng.below(2) as usize;
        match self.rng.below(100) {
            0..=29 => {
                for _ in 0..1 + self.rng.below(8) {
                    if let Some(f) = self.wire[d].pop_front() {
                        self.rx(1 - d, &f);
                    }
                }
            }
            30..=33 => self.mischief(d),
            34..=50 => self.clean_post_send(d),
            51..=62 => self.clean_post_recv(d),
            63..=75 => self.advance()?,
            // Some clean runs re-register a node's data region (same bytes, new keys) under traffic: WRs in flight
            // with the old keys must fail, never complete with other bytes than their own.
            76 if self.clean_rereg && self.rng.below(10) == 0 => self.rereg(d),
            _ => self.poll(d)?,
        }
        self.pump()?;
        if self.rng.below(8) == 0 {
            self.n[d].check_regions()?;
        }
        Ok(())
    }

    /// The wire turns honest: QPs in SQD or SQE go back to RTS, and time runs until every QP in RTS has an empty
    /// send queue (or its QP has failed), within a bounded virtual time.
    fn settle(&mut self) -> Result<(), String> {
        for d in 0..2 {
            for i in 0..2 {
                let q = self.n[d].qpns[i];
                if matches!(self.n[d].state(q), Some(QpState::Sqd | QpState::Sqe)) {
                    let _ = self.n[d].eng.modify_qp(q, &QpAttr { state: Some(QpState::Rts), ..QpAttr::default() });
                }
            }
        }
        let limit = self.now + Duration::from_millis(3_600_000);
        let mut stuck = 0u32;
        for _ in 0..2_000_000u32 {
            self.pump()?;
            let mut moved = false;
            for d in 0..2 {
                while let Some(f) = self.wire[d].pop_front() {
                    self.rx(1 - d, &f);
                    moved = true;
                }
            }
            if let Some(e) = self.fault.take() {
                return Err(e);
            }
            self.poll(0)?;
            self.poll(1)?;
            if self.idle() {
                return Ok(());
            }
            if moved {
                continue;
            }
            let next = [self.n[0].eng.poll_timeout(), self.n[1].eng.poll_timeout()].into_iter().flatten().min();
            let Some(t) = next else {
                return Err(format!("hang: work outstanding and no deadline: {}", self.outstanding()));
            };
            if t <= self.now {
                stuck += 1;
                if stuck > 10_000 {
                    return Err(format!("livelock: deadline {t:?} stays at or before now {:?}", self.now));
                }
            } else {
                stuck = 0;
                self.now = t;
            }
            if self.now > limit {
                return Err(format!("hang: an hour of virtual time and still {}", self.outstanding()));
            }
            for d in 0..2 {
                self.timeout_at_now(d)?;
            }
        }
        Err(format!("hang: 2M settle steps and still {}", self.outstanding()))
    }

    /// True when every live QP in RTS (or ERR) has nothing outstanding in its send queue.
    fn idle(&self) -> bool {
        self.n.iter().all(|n| {
            n.qpns.iter().all(|&q| {
                let Ok(i) = n.eng.query_qp(q) else { return true };
                !matches!(i.state, QpState::Rts | QpState::Err) || i.sq_outstanding == 0
            })
        }) && self.n.iter().all(|n| n.eng.cq_len(n.scq) == 0 && n.eng.cq_len(n.rcq) == 0)
    }

    fn outstanding(&self) -> String {
        let mut s = String::new();
        for (d, n) in self.n.iter().enumerate() {
            for &q in &n.qpns {
                if let Ok(i) = n.eng.query_qp(q) {
                    s += &format!(
                        "[n{d} qp {q:#x} {:?} sq_outstanding {} tracked {:?}] ",
                        i.state, i.sq_outstanding, n.track[&q].sends
                    );
                }
            }
        }
        s
    }

    /// After settling: signaled send WRs of idle QPs all completed; counters agree with what was seen.
    fn final_checks(&mut self) -> Result<(), String> {
        if self.clean {
            self.clean_final()?;
        }
        for d in 0..2 {
            self.n[d].check_regions()?;
            let n = &self.n[d];
            for &q in &n.qpns {
                let Ok(i) = n.eng.query_qp(q) else { continue };
                let t = &n.track[&q];
                if matches!(i.state, QpState::Rts | QpState::Err) && i.sq_outstanding == 0 && !self.small_cq {
                    if let Some(s) = t.sends.iter().find(|s| s.1) {
                        return Err(format!(
                            "n{d} qp {q:#x} idle in {:?} but signaled WR {} never completed",
                            i.state, s.0
                        ));
                    }
                }
                if i.state == QpState::Err && !t.recvs.is_empty() && !self.small_cq {
                    return Err(format!("n{d} qp {q:#x} in ERR with receive WRs never flushed: {:?}", t.recvs));
                }
                let c = n.eng.qp_counters(q).unwrap();
                if c.cq_overflows == 0 && c.send_completions + c.recv_completions != t.cqes {
                    return Err(format!(
                        "n{d} qp {q:#x}: counters say {} send + {} recv completions, {} seen",
                        c.send_completions, c.recv_completions, t.cqes
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Where the BTH starts in a frame of `repr` (Ethernet, IP, UDP before it).
fn bth_at(repr: &RoceRepr) -> usize {
    let ip = match repr.ip.addrs {
        IpAddrs::V4 { .. } => wire::IPV4_HEADER_LEN,
        IpAddrs::V6 { .. } => wire::IPV6_HEADER_LEN,
    };
    wire::ETHERNET_HEADER_LEN + ip + wire::UDP_HEADER_LEN
}

fn opcode_has_payload(o: Opcode) -> bool {
    o.info().is_some_and(|i| i.any(wire::op::PAYLOAD))
}

fn base_repr(to: usize, qpn: u32, v6: bool) -> RoceRepr {
    let mut repr =
        RoceRepr { udp_src: wire::rxe_udp_sport(0x99, qpn), udp_dst: wire::ROCE_UDP_PORT, ..RoceRepr::default() };
    repr.bth.dest_qp = qpn;
    repr.eth.src = MACS[1 - to];
    repr.eth.dst = MACS[to];
    repr.ip.addrs = addrs(1 - to, v6);
    repr.ip.ttl = 64;
    repr.ip.dont_frag = true;
    repr
}

/// One run: `steps` steps (fewer if a byte source runs out), then the honest settling and the final checks.
pub fn run(src: Src, steps: u64) -> Result<(), String> {
    let seed = match &src {
        Src::Seeded(_) => "seeded",
        Src::Bytes { .. } => "bytes",
    };
    let mut f = Fuzz::new(src);
    let res = (|| {
        for _ in 0..steps {
            if f.rng.exhausted() {
                break;
            }
            f.step()?;
        }
        f.settle()?;
        f.final_checks()
    })();
    if std::env::var_os("ROCE_FUZZ_VERBOSE").is_some() {
        let cqes: u64 = f.n.iter().flat_map(|n| n.track.values()).map(|t| t.cqes).sum();
        let tx = f.n[0].eng.stats().tx_frames + f.n[1].eng.stats().tx_frames;
        let st: Vec<String> = f.n.iter().flat_map(|n| n.qpns.map(|q| format!("{:?}", n.state(q)))).collect();
        let t = f.n[0].eng.qp_totals();
        eprintln!(
            "{seed} clean {} checked {} broken {:?}: {} posts, {cqes} CQEs, {tx} frames, rx {} dup {} bad_resp {} naks {}/{} at {:?}, states {st:?}",
            f.clean,
            f.checked,
            f.flows.iter().map(|x| [x[0].broken, x[1].broken]).collect::<Vec<_>>(),
            f.next_wr,
            t.rx_packets,
            t.duplicate_requests,
            t.bad_responses,
            t.nak_inv_req_sent + t.nak_rem_access_sent,
            t.nak_fatal_rcvd,
            f.now
        );
        for n in &f.n {
            let nz: Vec<String> = n.eng.stats().iter().filter(|x| x.1 > 0).map(|(k, v)| format!("{k}={v}")).collect();
            let t = n.eng.qp_totals();
            let qz: Vec<String> = t.iter().filter(|x| x.1 > 0).map(|(k, v)| format!("{k}={v}")).collect();
            eprintln!("   {}\n   {}", nz.join(" "), qz.join(" "));
        }
    }
    res.map_err(|e| {
        let tail: Vec<&String> = f.log.iter().rev().take(12).collect();
        format!("{e}\n  last actions (newest first): {tail:?}")
    })
}
