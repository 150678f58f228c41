//! A deterministic network simulator: two engines joined by links with delay, bandwidth, loss, duplication,
//! reordering and corruption, driven by a seeded RNG in virtual time. Used by the tests and by `rdp-sim`.
//!
//! The same seed and configuration give the same run, bit for bit. Nothing here reads a clock.

use crate::engine::{Engine, EngineConfig, RxMeta};
use crate::mr::{AccessFlags, MrKeys};
use crate::qp::{LocalIp, PeerAddr, QpAttr, QpCaps, QpState};
use crate::time::{Duration, Instant};
use crate::verbs::{CqId, Cqe, SendWr, Sge, WcStatus, WrOpcode};
use crate::wire::{IpAddrs, MacAddr};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub mod incast;

/// SplitMix64: a small, fast, seedable generator (no dependency, same sequence everywhere).
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// A value in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n.max(1))) >> 64) as u64
    }
    /// True with probability `p_ppm` parts per million.
    pub fn chance_ppm(&mut self, p_ppm: u32) -> bool {
        p_ppm > 0 && self.below(1_000_000) < u64::from(p_ppm)
    }
}

/// Probability as parts per million (integers keep runs identical on every machine).
pub fn ppm(p: f64) -> u32 {
    (p.clamp(0.0, 1.0) * 1_000_000.0).round() as u32
}

/// One direction of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Propagation delay.
    pub delay: Duration,
    /// Bandwidth in Mb/s (serialisation time = bytes * 8 / rate).
    pub mbps: u64,
    /// Loss probability (ppm).
    pub loss_ppm: u32,
    /// Duplication probability (ppm).
    pub dup_ppm: u32,
    /// Probability (ppm) that a frame is held back by up to `reorder_window`.
    pub reorder_ppm: u32,
    /// Largest extra delay of a reordered frame.
    pub reorder_window: Duration,
    /// Probability (ppm) that one random bit of a frame is flipped.
    pub corrupt_ppm: u32,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            delay: Duration::from_micros(2),
            mbps: 100_000,
            loss_ppm: 0,
            dup_ppm: 0,
            reorder_ppm: 0,
            reorder_window: Duration::from_micros(5),
            corrupt_ppm: 0,
        }
    }
}

/// What happened on the links.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames offered to the link.
    pub frames: u64,
    /// Bytes offered.
    pub bytes: u64,
    /// Frames dropped.
    pub lost: u64,
    /// Frames duplicated.
    pub duplicated: u64,
    /// Frames delayed out of order.
    pub reordered: u64,
    /// Frames corrupted.
    pub corrupted: u64,
}

struct Link {
    cfg: LinkConfig,
    free_at: Instant,
    in_flight: BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>>,
    stats: LinkStats,
}

/// Two engines (node 0 and node 1) and the links between them.
pub struct Sim {
    /// The engines.
    pub nodes: [Engine; 2],
    links: [Link; 2],
    /// Current virtual time.
    pub now: Instant,
    rng: SimRng,
    seq: u64,
    /// Set when the node's `poll_transmit` returned nothing; cleared by any input to the node.
    idle: [bool; 2],
    buf: Vec<u8>,
}

/// Addresses of the two nodes.
pub const NODE_MAC: [MacAddr; 2] = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
/// IPv4 addresses of the two nodes.
pub const NODE_IP: [[u8; 4]; 2] = [[10, 0, 0, 1], [10, 0, 0, 2]];
/// IPv6 addresses of the two nodes (documentation prefix 2001:db8::/32).
pub const NODE_IP6: [[u8; 16]; 2] = [
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
];

impl Sim {
    /// Two engines with `cfg` (addresses overridden per node) joined by `links[0]` (0 -> 1) and `links[1]`.
    pub fn new(cfg: EngineConfig, links: [LinkConfig; 2], seed: u64) -> Sim {
        let mk = |n: usize| {
            Engine::new(EngineConfig {
                local_mac: NODE_MAC[n],
                local_ip: LocalIp { v4: Some(NODE_IP[n]), v6: Some(NODE_IP6[n]) },
                ..cfg
            })
        };
        let link = |c: LinkConfig| Link {
            cfg: c,
            free_at: Instant::ZERO,
            in_flight: BinaryHeap::new(),
            stats: LinkStats::default(),
        };
        Sim {
            nodes: [mk(0), mk(1)],
            links: [link(links[0]), link(links[1])],
            now: Instant::ZERO,
            rng: SimRng::new(seed),
            seq: 0,
            idle: [false; 2],
            buf: vec![0u8; 4096 + crate::engine::MAX_HEADER_BYTES],
        }
    }

    /// Link statistics of direction `d` (0: node 0 -> node 1).
    pub fn link_stats(&self, d: usize) -> LinkStats {
        self.links[d].stats
    }

    /// The peer address of node `n` as seen from the other node.
    pub fn peer_of(n: usize) -> PeerAddr {
        PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: NODE_IP[n] }, mac: NODE_MAC[n] }
    }

    /// The peer address of node `n` over IPv6 (both nodes have an IPv4 and an IPv6 address).
    pub fn peer6_of(n: usize) -> PeerAddr {
        PeerAddr { ip: IpAddrs::V6 { src: [0; 16], dst: NODE_IP6[n] }, mac: NODE_MAC[n] }
    }

    /// Marks node `n` as having new work (after posting WRs).
    pub fn kick(&mut self, n: usize) {
        self.idle[n] = false;
    }

    /// Processes everything due at `now`, then moves time to the next event. Returns false when nothing at all is
    /// pending (no frames in flight, no timers, nothing to send).
    pub fn step(&mut self) -> bool {
        self.process();
        self.advance()
    }

    /// Processes everything due at the current time: deliveries, timers, transmissions.
    pub fn process(&mut self) {
        let now = self.now;
        // Deliver frames due now.
        for d in 0..2 {
            let dst = 1 - d;
            while let Some(Reverse((t, _, _))) = self.links[d].in_flight.peek() {
                if *t > now {
                    break;
                }
                let Reverse((_, _, mut frame)) = self.links[d].in_flight.pop().expect("peeked");
                self.nodes[dst].handle_rx_mut(now, &mut frame, RxMeta::default());
                self.idle[dst] = false;
            }
        }
        for n in 0..2 {
            if let Some(t) = self.nodes[n].poll_timeout() {
                if t <= now {
                    self.nodes[n].handle_timeout(now);
                    self.idle[n] = false;
                }
            }
        }
        // Transmit while the link is free.
        for n in 0..2 {
            while !self.idle[n] && self.links[n].free_at <= now {
                let Some(len) = self.nodes[n].poll_transmit(now, &mut self.buf) else {
                    self.idle[n] = true;
                    break;
                };
                let frame = self.buf[..len].to_vec();
                self.send(n, frame);
            }
        }
    }

    /// Moves time to the next event; false if there is none.
    pub fn advance(&mut self) -> bool {
        let now = self.now;
        let mut next = Instant::MAX;
        for d in 0..2 {
            if let Some(Reverse((t, _, _))) = self.links[d].in_flight.peek() {
                next = next.min(*t);
            }
            if let Some(t) = self.nodes[d].poll_timeout() {
                next = next.min(t);
            }
            if !self.idle[d] && self.nodes[d].has_pending_tx() {
                next = next.min(self.links[d].free_at.max(now));
            }
        }
        if next == Instant::MAX {
            return false;
        }
        // Time always moves forward when nothing can happen now.
        self.now = if next > now { next } else { now };
        true
    }

    fn send(&mut self, n: usize, mut frame: Vec<u8>) {
        let link = &mut self.links[n];
        let c = link.cfg;
        link.stats.frames += 1;
        link.stats.bytes += frame.len() as u64;
        let ser = Duration::from_nanos((frame.len() as u64 * 8 * 1000).div_ceil(c.mbps.max(1)));
        let depart = link.free_at.max(self.now) + ser;
        link.free_at = depart;
        if self.rng.chance_ppm(c.loss_ppm) {
            link.stats.lost += 1;
            return;
        }
        if self.rng.chance_ppm(c.corrupt_ppm) && !frame.is_empty() {
            let bit = self.rng.below(frame.len() as u64 * 8);
            frame[(bit / 8) as usize] ^= 1 << (bit % 8);
            link.stats.corrupted += 1;
        }
        let mut arrive = depart + c.delay;
        if self.rng.chance_ppm(c.reorder_ppm) {
            arrive += Duration::from_nanos(self.rng.below(c.reorder_window.as_nanos().max(1)) + 1);
            link.stats.reordered += 1;
        }
        if self.rng.chance_ppm(c.dup_ppm) {
            link.stats.duplicated += 1;
            let extra = Duration::from_nanos(self.rng.below(1000) + 1);
            self.seq += 1;
            link.in_flight.push(Reverse((arrive + extra, self.seq, frame.clone())));
        }
        self.seq += 1;
        link.in_flight.push(Reverse((arrive, self.seq, frame)));
    }
}

/// Operation of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimOp {
    /// SEND (receives posted at node 1).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ (node 0 reads node 1's memory).
    Read,
    /// Atomics: alternating fetch-and-add and compare-and-swap on one counter per QP.
    Atomic,
}

/// A workload: `msgs` messages of `size` bytes on each of `qps` QP pairs, node 0 the requester.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    /// Operation.
    pub op: SimOp,
    /// Message size (ignored for atomics: 8).
    pub size: u32,
    /// Messages per QP.
    pub msgs: u32,
    /// QP pairs.
    pub qps: u32,
    /// Path MTU.
    pub mtu: u32,
    /// Outstanding WRs per QP.
    pub depth: u32,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// Give up after this much virtual time.
    pub time_limit: Duration,
    /// Give up after this many frames on the two links together (retransmissions included): bounds the real time
    /// a run can take when losses keep it going (u64::MAX: no limit).
    pub frame_limit: u64,
    /// Connect the QPs over IPv6 GIDs instead of IPv4.
    pub ipv6: bool,
}

impl Default for Workload {
    fn default() -> Self {
        Workload {
            op: SimOp::Write,
            size: 4096,
            msgs: 100,
            qps: 1,
            mtu: 1024,
            depth: 16,
            timeout: 8,
            retry_cnt: 7,
            time_limit: Duration::from_millis(60_000),
            frame_limit: u64::MAX,
            ipv6: false,
        }
    }
}

/// The outcome of a workload run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimReport {
    /// Every WR completed successfully, exactly once and in order, and every byte verified.
    pub ok: bool,
    /// Messages completed successfully.
    pub completed: u64,
    /// Messages posted in total.
    pub expected: u64,
    /// Bytes compared against what was sent.
    pub verified_bytes: u64,
    /// Retransmitted packets (both nodes).
    pub retransmits: u64,
    /// NAKs sent (all kinds, both nodes).
    pub naks: u64,
    /// Local ACK timeouts.
    pub timeouts: u64,
    /// Goodput in Gb/s of virtual time.
    pub goodput_gbps: f64,
    /// Virtual time used.
    pub sim_time_us: u64,
    /// The first problem found, if any.
    pub failure: Option<String>,
}

impl SimReport {
    /// The `result:` line of rdp-sim.
    pub fn result_line(&self) -> String {
        format!(
            "result: status={} completed={}/{} verified_bytes={} retransmits={} naks={} timeouts={} goodput_gbps={:.3} sim_time_us={}",
            if self.ok { "ok" } else { "FAIL" },
            self.completed,
            self.expected,
            self.verified_bytes,
            self.retransmits,
            self.naks,
            self.timeouts,
            self.goodput_gbps,
            self.sim_time_us
        )
    }
}

/// The byte at offset `i` of message `k` on QP `q`.
#[inline]
pub fn pattern(q: u32, k: u64, i: u64) -> u8 {
    let x = k.wrapping_mul(0x9e37_79b9).wrapping_add(i.wrapping_mul(7)).wrapping_add(u64::from(q) * 131);
    (x ^ (x >> 11) ^ (i >> 8)) as u8
}

struct Pair {
    qpn: [u32; 2],
    mr: [MrKeys; 2],
    posted: u64,
    done: u64,
    recv_done: u64,
    atomic_expect: u64,
}

const VA: [u64; 2] = [0x1000_0000, 0x2000_0000];

/// Runs a workload on a simulator and checks every completion and every byte.
pub fn run_workload(sim: &mut Sim, w: &Workload) -> SimReport {
    let mut rep = SimReport { expected: u64::from(w.msgs) * u64::from(w.qps), ..SimReport::default() };
    let size = if w.op == SimOp::Atomic { 8 } else { w.size as u64 };
    let slots = u64::from(w.depth.max(1)).min(u64::from(w.msgs.max(1)));
    let region = (slots * size).max(8) as usize;
    // One CQ per node shared by every QP: the driver then costs O(completions), not O(QPs), per event.
    let mut shared_cq = [CqId(0); 2];
    for (n, c) in shared_cq.iter_mut().enumerate() {
        match sim.nodes[n].create_cq((w.depth * 2 + 16).saturating_mul(w.qps).min(1 << 20)) {
            Ok(id) => *c = id,
            Err(e) => {
                rep.failure = Some(format!("setup: {e}"));
                return rep;
            }
        }
    }
    let mut pairs = Vec::new();
    let mut by_qpn: [std::collections::HashMap<u32, usize>; 2] = Default::default();
    for q in 0..w.qps {
        match setup_pair(sim, w, q, region, shared_cq) {
            Ok(p) => {
                by_qpn[0].insert(p.qpn[0], pairs.len());
                by_qpn[1].insert(p.qpn[1], pairs.len());
                pairs.push(p);
            }
            Err(e) => {
                rep.failure = Some(format!("setup: {e}"));
                return rep;
            }
        }
    }
    // Fill node 1's memory for READ (each slot holds the pattern of its slot number).
    if w.op == SimOp::Read {
        for (q, p) in pairs.iter().enumerate() {
            let mem = sim.nodes[1].mr_bytes_mut(p.mr[1].lkey).expect("mr");
            for s in 0..slots {
                for i in 0..size {
                    mem[(s * size + i) as usize] = pattern(q as u32, s, i);
                }
            }
        }
    }
    let deadline = Instant::ZERO + w.time_limit;
    let mut cqes = [Cqe::EMPTY; 32];
    let mut same_time = 0u32;
    let mut last_now = Instant::MAX;
    let mut to_post: Vec<usize> = (0..pairs.len()).collect();
    let mut pairs_done = if w.msgs == 0 { pairs.len() } else { 0 };
    loop {
        // A loop that never lets virtual time move is a livelock in the engine: report it, never hang.
        if sim.now == last_now {
            same_time += 1;
            if same_time > 1_000_000 {
                rep.failure = Some(format!("livelock: virtual time stuck at {}", sim.now));
                break;
            }
        } else {
            same_time = 0;
            last_now = sim.now;
        }
        // Post up to depth outstanding on the QPs that have room.
        for q in to_post.drain(..) {
            let p = &mut pairs[q];
            while p.posted < u64::from(w.msgs) && p.posted - p.done < u64::from(w.depth) {
                if let Err(e) = post_one(sim, w, q as u32, p, slots, size) {
                    rep.failure.get_or_insert(format!("post on QP {:#x}: {e}", p.qpn[0]));
                    break;
                }
                p.posted += 1;
            }
        }
        sim.kick(0);
        sim.kick(1);
        sim.process();
        // Completions, dispatched to their QP pair.
        for n in 0..2 {
            loop {
                let got = sim.nodes[n].poll_cq(shared_cq[n], &mut cqes);
                if got == 0 {
                    break;
                }
                for c in &cqes[..got] {
                    let Some(&q) = by_qpn[n].get(&c.qpn) else {
                        rep.failure.get_or_insert(format!("completion for unknown QP {:#x}", c.qpn));
                        continue;
                    };
                    let p = &mut pairs[q];
                    let r = if n == 0 {
                        let before = p.done;
                        let r = check_send_cqe(sim, w, q as u32, p, c, slots, size, &mut rep);
                        if p.done != before {
                            to_post.push(q);
                            if p.done == u64::from(w.msgs) {
                                pairs_done += 1;
                            }
                        }
                        r
                    } else {
                        check_recv_cqe(sim, w, q as u32, p, c, size, &mut rep)
                    };
                    if let Err(e) = r {
                        rep.failure.get_or_insert(e);
                    }
                }
            }
        }
        if pairs_done == pairs.len() || rep.failure.is_some() {
            break;
        }
        if sim.now > deadline {
            rep.failure = Some(format!("time limit of {} reached", w.time_limit));
            break;
        }
        if sim.links[0].stats.frames + sim.links[1].stats.frames > w.frame_limit {
            rep.failure = Some(format!("frame limit of {} frames reached", w.frame_limit));
            break;
        }
        // Nothing pending in the simulator is a stall only if no WR waits to be posted either: with one WR in
        // flight per QP (depth 1), the completion just reaped leaves the links and timers empty until the next post.
        if !sim.advance() && to_post.is_empty() {
            rep.failure = Some("simulation stalled: nothing in flight, no timers, work outstanding".into());
            break;
        }
    }
    // Atomics: the counter must hold the sum of every add.
    if rep.failure.is_none() && w.op == SimOp::Atomic {
        for p in &pairs {
            let mem = sim.nodes[1].mr_bytes(p.mr[1].lkey).expect("mr");
            let v = u64::from_le_bytes(mem[..8].try_into().expect("8 bytes"));
            if v != p.atomic_expect {
                rep.failure = Some(format!("atomic counter {v} != expected {}", p.atomic_expect));
            }
            rep.verified_bytes += 8;
        }
    }
    let t = [sim.nodes[0].qp_totals(), sim.nodes[1].qp_totals()];
    rep.retransmits = t[0].retransmitted_packets + t[1].retransmitted_packets;
    rep.naks = t
        .iter()
        .map(|c| c.nak_psn_seq_sent + c.nak_inv_req_sent + c.nak_rem_access_sent + c.nak_rem_op_sent + c.rnr_nak_sent)
        .sum();
    rep.timeouts = t[0].retry_timeouts + t[1].retry_timeouts;
    rep.completed = pairs.iter().map(|p| p.done).sum();
    rep.sim_time_us = sim.now.as_nanos() / 1000;
    let bytes = rep.completed as f64 * size as f64;
    rep.goodput_gbps = if sim.now.as_nanos() > 0 { bytes * 8.0 / sim.now.as_nanos() as f64 } else { 0.0 };
    rep.ok = rep.failure.is_none() && rep.completed == rep.expected;
    rep
}

fn setup_pair(sim: &mut Sim, w: &Workload, q: u32, region: usize, cq: [CqId; 2]) -> Result<Pair, String> {
    let mut qpn = [0; 2];
    let mut mr = [MrKeys { lkey: 0, rkey: 0 }; 2];
    for n in 0..2 {
        let e = &mut sim.nodes[n];
        let pd = e.alloc_pd();
        mr[n] = e.reg_mr(pd, VA[n] + u64::from(q) * (1 << 36), region, AccessFlags::ALL).map_err(|e| e.to_string())?;
        let caps = QpCaps { max_send_wr: w.depth.max(1), max_recv_wr: w.depth.max(1), ..QpCaps::default() };
        qpn[n] = e.create_qp(pd, cq[n], cq[n], caps).map_err(|e| e.to_string())?;
    }
    for n in 0..2 {
        let e = &mut sim.nodes[n];
        let psn = 0xff_fff0 - q * 3; // start near the wrap so runs cross 2^24
        e.modify_qp(
            qpn[n],
            &QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() },
        )
        .map_err(|e| e.to_string())?;
        e.modify_qp(
            qpn[n],
            &QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(w.mtu),
                dest_qpn: Some(qpn[1 - n]),
                rq_psn: Some(psn),
                max_dest_rd_atomic: Some(16),
                min_rnr_timer: Some(1),
                peer: Some(if w.ipv6 { Sim::peer6_of(1 - n) } else { Sim::peer_of(1 - n) }),
                ..QpAttr::default()
            },
        )
        .map_err(|e| e.to_string())?;
        e.modify_qp(
            qpn[n],
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(psn),
                timeout: Some(w.timeout),
                retry_cnt: Some(w.retry_cnt),
                rnr_retry: Some(7),
                max_rd_atomic: Some(16),
                ..QpAttr::default()
            },
        )
        .map_err(|e| e.to_string())?;
    }
    let mut p = Pair { qpn, mr, posted: 0, done: 0, recv_done: 0, atomic_expect: 0 };
    if w.op == SimOp::Send {
        for k in 0..u64::from(w.depth.min(w.msgs)) {
            post_recv_slot(sim, w, q, &p, k)?;
        }
    }
    p.recv_done = 0;
    Ok(p)
}

fn slot_va(n: usize, slot: u64, size: u64, q: u32) -> u64 {
    VA[n] + u64::from(q) * (1 << 36) + slot * size
}

fn post_recv_slot(sim: &mut Sim, w: &Workload, q: u32, p: &Pair, k: u64) -> Result<(), String> {
    let size = u64::from(w.size);
    let slots = u64::from(w.depth.max(1)).min(u64::from(w.msgs.max(1)));
    let sge = Sge { addr: slot_va(1, k % slots, size, q), len: w.size, lkey: p.mr[1].lkey };
    sim.nodes[1].post_recv(p.qpn[1], k, &[sge]).map_err(|e| e.to_string())
}

fn post_one(sim: &mut Sim, w: &Workload, q: u32, p: &mut Pair, slots: u64, size: u64) -> Result<(), String> {
    let k = p.posted;
    let slot = k % slots;
    let local = slot_va(0, slot, size, q);
    let remote = slot_va(1, slot, size, q);
    let (opcode, len) = match w.op {
        SimOp::Send => (WrOpcode::Send, size),
        SimOp::Write => (WrOpcode::RdmaWrite, size),
        SimOp::Read => (WrOpcode::RdmaRead, size),
        SimOp::Atomic => (if k.is_multiple_of(2) { WrOpcode::AtomicFetchAdd } else { WrOpcode::AtomicCmpSwp }, 8),
    };
    if matches!(w.op, SimOp::Send | SimOp::Write) {
        let mem = sim.nodes[0].mr_bytes_mut(p.mr[0].lkey).ok_or("local MR gone")?;
        let base = (slot * size) as usize;
        for i in 0..size {
            mem[base + i as usize] = pattern(q, k, i);
        }
    }
    let mut wr = SendWr::new(k, opcode)
        .remote(if w.op == SimOp::Atomic { VA[1] + u64::from(q) * (1 << 36) } else { remote }, p.mr[1].rkey);
    if w.op == SimOp::Atomic {
        // FETCH_ADD adds k+1; CMP_SWP swaps the value it expects for that value + 1000.
        if opcode == WrOpcode::AtomicFetchAdd {
            wr.compare_add = k + 1;
        } else {
            wr.compare_add = atomic_value_before(k);
            wr.swap = wr.compare_add + 1000;
        }
    }
    let sge = Sge { addr: local, len: len as u32, lkey: p.mr[0].lkey };
    sim.nodes[0].post_send(p.qpn[0], &wr, &[sge]).map_err(|e| e.to_string())
}

/// The counter value before atomic WR `k`: even k add k+1, odd k swap v for v + 1000.
pub fn atomic_value_before(k: u64) -> u64 {
    let mut v = 0u64;
    for j in 0..k {
        v = if j.is_multiple_of(2) { v + j + 1 } else { v + 1000 };
    }
    v
}

#[allow(clippy::too_many_arguments)]
fn check_send_cqe(
    sim: &mut Sim,
    w: &Workload,
    q: u32,
    p: &mut Pair,
    c: &Cqe,
    slots: u64,
    size: u64,
    rep: &mut SimReport,
) -> Result<(), String> {
    if c.status != WcStatus::Success {
        return Err(format!("QP {:#x} WR {} completed with {:?} ({})", p.qpn[0], c.wr_id, c.status, c.status.as_str()));
    }
    if c.wr_id != p.done {
        return Err(format!(
            "QP {:#x}: completion for WR {} but expected WR {} (order or duplicate)",
            p.qpn[0], c.wr_id, p.done
        ));
    }
    let k = c.wr_id;
    let slot = k % slots;
    match w.op {
        SimOp::Write => {
            let mem = sim.nodes[1].mr_bytes(p.mr[1].lkey).ok_or("remote MR gone")?;
            let base = (slot * size) as usize;
            for i in 0..size {
                if mem[base + i as usize] != pattern(q, k, i) {
                    return Err(format!("QP {:#x} WRITE {k}: byte {i} differs at the responder", p.qpn[0]));
                }
            }
            rep.verified_bytes += size;
        }
        SimOp::Read => {
            let mem = sim.nodes[0].mr_bytes(p.mr[0].lkey).ok_or("local MR gone")?;
            let base = (slot * size) as usize;
            for i in 0..size {
                if mem[base + i as usize] != pattern(q, slot, i) {
                    return Err(format!("QP {:#x} READ {k}: byte {i} differs at the requester", p.qpn[0]));
                }
            }
            rep.verified_bytes += size;
        }
        SimOp::Atomic => {
            let mem = sim.nodes[0].mr_bytes(p.mr[0].lkey).ok_or("local MR gone")?;
            let base = (slot * 8) as usize;
            let got = u64::from_le_bytes(mem[base..base + 8].try_into().expect("8"));
            let want = atomic_value_before(k);
            if got != want {
                return Err(format!("QP {:#x} atomic {k}: returned {got}, expected {want}", p.qpn[0]));
            }
            p.atomic_expect = if k.is_multiple_of(2) { want + k + 1 } else { want + 1000 };
            rep.verified_bytes += 8;
        }
        SimOp::Send => {}
    }
    if w.op == SimOp::Send && p.recv_done <= k {
        // The receive side must have completed this message before the sender saw its ACK.
        return Err(format!("QP {:#x} SEND {k}: sender completed before the receiver", p.qpn[0]));
    }
    p.done += 1;
    Ok(())
}

fn check_recv_cqe(
    sim: &mut Sim,
    w: &Workload,
    q: u32,
    p: &mut Pair,
    c: &Cqe,
    size: u64,
    rep: &mut SimReport,
) -> Result<(), String> {
    if c.status != WcStatus::Success {
        return Err(format!("QP {:#x} receive {} completed with {:?}", p.qpn[1], c.wr_id, c.status));
    }
    let k = p.recv_done;
    if c.wr_id != k || u64::from(c.byte_len) != size {
        return Err(format!(
            "QP {:#x}: receive completion wr_id {} len {} (expected {k}, {size})",
            p.qpn[1], c.wr_id, c.byte_len
        ));
    }
    let slots = u64::from(w.depth.max(1)).min(u64::from(w.msgs.max(1)));
    let mem = sim.nodes[1].mr_bytes(p.mr[1].lkey).ok_or("recv MR gone")?;
    let base = ((k % slots) * size) as usize;
    for i in 0..size {
        if mem[base + i as usize] != pattern(q, k, i) {
            return Err(format!("QP {:#x} SEND {k}: received byte {i} differs", p.qpn[1]));
        }
    }
    rep.verified_bytes += size;
    p.recv_done += 1;
    let next = k + u64::from(w.depth.min(w.msgs));
    if next < u64::from(w.msgs) {
        post_recv_slot(sim, w, q, p, next)?;
    }
    Ok(())
}
