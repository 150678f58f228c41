//! An N:1 incast in virtual time: N sender engines, one switch with a shared egress queue, one receiver engine.
//!
//! ```text
//! sender 0 --link--\                                   /-- ACKs, CNPs (uncongested) --> senders
//! sender 1 --link---> switch: egress queue (RED/ECN, tail drop) --link--> receiver (one QP per sender)
//! sender N --link--/
//! ```
//! Every link runs at the same rate. Each sender has one RC QP that streams RDMA WRITEs (64 KiB messages by
//! default, MTU 4096, a deep send queue) to its own QP on the receiver, so the switch's egress port towards the
//! receiver is the only bottleneck. The congestion point (CP) marks on the egress queue like RED: no mark below
//! Kmin, probability rising linearly to Pmax at Kmax, every frame above Kmax (ROCE-NOTES §3.1); a frame that
//! should be marked but is Not-ECT is dropped instead, and a frame that does not fit in the buffer is tail-dropped.
//! The reverse path (ACKs, CNPs) has no queue: it only adds serialisation and propagation delay.
//!
//! Marking is decided when a frame leaves the queue (default), as the DCQCN authors' ns-3 switch and the HPCC
//! simulator do: the marked frame then carries the news without waiting behind the queue it reports. Marking on
//! enqueue is available ([`IncastConfig::mark_on_dequeue`] = false) and reacts one queueing delay later: with
//! the ConnectX DCQCN defaults an 8:1 incast at 25 Gb/s then drops 5-9 times as many frames (and loses up to 13 % of
//! utilisation) as with marking on dequeue, whatever the thresholds.
//!
//! The default switch is set as a 25 Gb/s data-centre switch for RoCE would be: RED Kmin 20 KiB, Kmax 200 KiB,
//! Pmax 10 %, on dequeue, 1 MiB for the port. Huawei's CloudEngine guide ("Configuring Static ECN",
//! support.huawei.com EDOC1100155250) recommends Kmin 7 KB, Kmax 200 KB, Pmax 10 % for throughput-sensitive
//! 25GE ports (150 KB and 30 % for delay-sensitive ones), from an upper threshold of 2-3 bandwidth-delay
//! products; the DCQCN paper used 5 KB / 200 KB / 1 % at 40 Gb/s, HPCC's DCQCN runs 100 KB / 400 KB / 20 % at
//! 25 Gb/s. All of these give the same picture for an 8:1 incast at 25 Gb/s (seeds 1-8 each): with the
//! ConnectX defaults 74-178 drops per run on average, all in the first millisecond, none from 2 ms on; with
//! [`DcqcnConfig::connectx_lossy`] no drops at all.
//!
//! Nothing reads a clock; the only randomness is the RED coin, from a seeded [`SimRng`]: the same configuration
//! and seed give the same report and trace bit for bit.

use super::SimRng;
use crate::cc::{CcAlgorithm, CcConfig, DcqcnConfig};
use crate::engine::{Engine, EngineConfig, RxMeta, MAX_HEADER_BYTES};
use crate::mr::AccessFlags;
use crate::qp::{LocalIp, PeerAddr, QpAttr, QpCaps, QpState};
use crate::time::{Duration, Instant};
use crate::verbs::{CqId, Cqe, SendWr, Sge, WcOpcode, WcStatus, WrOpcode};
use crate::wire::{Ecn, EthernetFrame, IpAddrs, Ipv4Packet, MacAddr};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Configuration of an incast run.
#[derive(Clone, Debug)]
pub struct IncastConfig {
    /// Number of senders (1..=1000).
    pub senders: u32,
    /// Rate of every link, Mb/s.
    pub link_mbps: u64,
    /// Propagation delay of each hop (sender to switch, switch to receiver, and back).
    pub hop_delay: Duration,
    /// Extra one-way delay per flow on its sender's link (missing entries are 0): flows with different RTTs.
    pub extra_delay: Vec<Duration>,
    /// When each flow starts sending (missing entries start at 0): late joiners.
    pub start_at: Vec<Duration>,
    /// RED: no marking at or below this queue depth, bytes.
    pub kmin_bytes: u64,
    /// RED: every frame marked above this depth, bytes.
    pub kmax_bytes: u64,
    /// RED: marking probability at Kmax, parts per million.
    pub pmax_ppm: u32,
    /// Switch buffer for the egress queue, bytes (tail drop beyond it).
    pub buffer_bytes: u64,
    /// Decide marking when a frame leaves the queue (true) or when it enters (false).
    pub mark_on_dequeue: bool,
    /// Virtual time to run.
    pub duration: Duration,
    /// Throughput, fairness and utilisation are measured from this time to the end (after convergence).
    pub measure_from: Duration,
    /// Congestion control of every engine (`line_rate_mbps` is set from `link_mbps`).
    pub cc: CcConfig,
    /// WRITE size, bytes.
    pub msg_size: u32,
    /// Path MTU.
    pub mtu: u32,
    /// Outstanding WRITEs per sender.
    pub depth: u32,
    /// Trace sample period (0 = no trace).
    pub sample_every: Duration,
    /// RNG seed (RED marking).
    pub seed: u64,
}

impl Default for IncastConfig {
    fn default() -> Self {
        IncastConfig {
            senders: 8,
            link_mbps: 25_000,
            hop_delay: Duration::from_micros(1),
            extra_delay: Vec::new(),
            start_at: Vec::new(),
            kmin_bytes: 20 << 10,
            kmax_bytes: 200 << 10,
            pmax_ppm: 100_000,
            buffer_bytes: 1 << 20,
            mark_on_dequeue: true,
            duration: Duration::from_millis(20),
            measure_from: Duration::from_millis(10),
            cc: CcConfig { algorithm: CcAlgorithm::Dcqcn, dcqcn: DcqcnConfig::default(), ..CcConfig::default() },
            msg_size: 64 << 10,
            mtu: 4096,
            depth: 16,
            sample_every: Duration::from_micros(10),
            seed: 1,
        }
    }
}

/// One flow's results.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FlowReport {
    /// Payload bytes the receiver accepted in the measurement window.
    pub bytes: u64,
    /// Goodput in the measurement window, Gb/s.
    pub goodput_gbps: f64,
    /// WRITEs completed over the whole run.
    pub completed: u64,
    /// CNPs the sender acted on.
    pub cnps_rcvd: u64,
    /// Rate decreases.
    pub rate_decreases: u64,
    /// Lowest and highest sampled rate, kb/s (the pacer's rate; the line rate without congestion control).
    pub min_rate_kbps: u64,
    /// Highest sampled rate, kb/s.
    pub max_rate_kbps: u64,
    /// Retransmitted packets.
    pub retransmits: u64,
}

/// One trace sample of one flow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRow {
    /// Virtual time, ns.
    pub time_ns: u64,
    /// Flow (sender) index.
    pub flow: u32,
    /// The sender's rate setting, kb/s.
    pub rate_kbps: u64,
    /// Payload bytes the receiver accepted for this flow since the previous sample.
    pub bytes: u64,
    /// Switch egress queue, bytes.
    pub queue_bytes: u64,
}

/// The outcome of an incast run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IncastReport {
    /// No WR failed and the simulation never stalled (drops and unfairness do not make a run fail).
    pub ok: bool,
    /// The first problem, if any.
    pub failure: Option<String>,
    /// Per flow.
    pub flows: Vec<FlowReport>,
    /// Jain's fairness index of the flows' goodput in the measurement window.
    pub jain: f64,
    /// Bottleneck utilisation in the measurement window: frame bytes the switch sent to the receiver over what
    /// the link could carry.
    pub util: f64,
    /// Largest egress queue, bytes.
    pub max_queue_bytes: u64,
    /// Time-averaged egress queue over the whole run, bytes.
    pub mean_queue_bytes: f64,
    /// CNPs the receiver sent.
    pub cnps_sent: u64,
    /// Frames marked CE by the switch.
    pub marked: u64,
    /// Frames dropped by the switch (tail drop, and Not-ECT frames RED chose).
    pub drops: u64,
    /// The part of `drops` in the measurement window (after convergence).
    pub window_drops: u64,
    /// Samples, in time order (flows in order within a sample).
    pub trace: Vec<TraceRow>,
}

impl IncastReport {
    /// The `result:` line of `rdp-sim --incast`.
    pub fn result_line(&self) -> String {
        format!(
            "result: status={} flows={} jain={:.4} util={:.4} max_queue_kb={:.1} cnps={} drops={}",
            if self.ok { "ok" } else { "FAIL" },
            self.flows.len(),
            self.jain,
            self.util,
            self.max_queue_bytes as f64 / 1024.0,
            self.cnps_sent,
            self.drops
        )
    }
}

/// Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all equal, 1/n when one takes everything.
pub fn jain_index(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || s2 == 0.0 {
        return 0.0;
    }
    s * s / (x.len() as f64 * s2)
}

/// A frame in flight: (arrival, sequence for a stable order, destination, bytes).
type InFlight = BinaryHeap<Reverse<(Instant, u64, u32, Vec<u8>)>>;

struct Flow {
    engine: Engine,
    qpn: u32,
    cq: CqId,
    lkey: u32,
    /// The receiver region's rkey for this flow.
    rkey: u32,
    /// The receiver's QP for this flow.
    rqpn: u32,
    free_at: Instant,
    idle: bool,
    posted: u64,
    done: u64,
    start: Instant,
    extra: Duration,
}

const RECV_VA: u64 = 0x4000_0000;
const SEND_VA: u64 = 0x1000_0000;

fn sender_mac(i: u32) -> MacAddr {
    MacAddr([2, 0, 0, 1, (i >> 8) as u8, i as u8])
}

fn sender_ip(i: u32) -> [u8; 4] {
    [10, 1 + (i >> 8) as u8, i as u8, 1]
}

const RECV_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 0x64]);
const RECV_IP: [u8; 4] = [10, 0, 0, 100];

/// Sets CE in an IPv4 frame's ECN field and updates the header checksum incrementally (RFC 1624, as a switch
/// does); false if the frame is not ECN-capable (Not-ECT) or not IPv4.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(&frame[..]) else { return false };
    let h = eth.header_len();
    if eth.payload_ethertype() != 0x0800 || Ipv4Packet::new_checked(&frame[h..]).is_err() {
        return false;
    }
    let tos = frame[h + 1];
    if Ecn::from_bits(tos) == Ecn::NotEct {
        return false;
    }
    let new_tos = tos | Ecn::Ce.bits();
    // HC' = ~(~HC + ~m + m') over the 16-bit word holding version/IHL and TOS.
    let m = u32::from(u16::from_be_bytes([frame[h], tos]));
    let m2 = u32::from(u16::from_be_bytes([frame[h], new_tos]));
    let hc = u32::from(u16::from_be_bytes([frame[h + 10], frame[h + 11]]));
    let mut sum = (!hc & 0xffff) + (!m & 0xffff) + m2;
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    frame[h + 1] = new_tos;
    frame[h + 10..h + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    true
}

/// The switch's egress port towards the receiver.
struct Egress {
    queue: VecDeque<Vec<u8>>,
    bytes: u64,
    free_at: Instant,
    /// Frame bytes on the wire from `window_start` on: a frame that straddles the window's start counts for its
    /// part inside the window (and the one still on the wire at the end, for its part before the end: see `run`).
    sent_in_window: u64,
    /// The last frame sent: its start, its end and its bytes.
    last_tx: (Instant, Instant, u64),
    max_bytes: u64,
    /// Integral of queue bytes over time (bytes * ns) and the time it was last updated.
    area: u128,
    area_at: Instant,
    marked: u64,
    drops: u64,
    /// Drops from the start of the measurement window on.
    window_drops: u64,
    /// The measurement window has started.
    in_window: bool,
}

impl Egress {
    fn drop(&mut self) {
        self.drops += 1;
        self.window_drops += u64::from(self.in_window);
    }
}

/// The incast simulator.
pub struct Incast {
    cfg: IncastConfig,
    flows: Vec<Flow>,
    recv: Engine,
    recv_cq: CqId,
    recv_free_at: Instant,
    recv_idle: bool,
    up: InFlight,
    down: InFlight,
    back: InFlight,
    sw: Egress,
    now: Instant,
    rng: SimRng,
    seq: u64,
    buf: Vec<u8>,
}

impl Incast {
    /// Builds the topology and connects every flow.
    pub fn new(cfg: IncastConfig) -> Result<Incast, String> {
        if cfg.senders == 0 || cfg.senders > 1000 {
            return Err(format!("senders = {} must be 1..=1000", cfg.senders));
        }
        if cfg.link_mbps == 0 || cfg.kmax_bytes < cfg.kmin_bytes || cfg.msg_size == 0 {
            return Err("link rate and message size must be > 0, Kmax >= Kmin".into());
        }
        let cc = CcConfig { line_rate_mbps: cfg.link_mbps.min(1_600_000) as u32, ..cfg.cc };
        cc.validate()?;
        let base = EngineConfig { cc, max_unacked_psns: 512, ..EngineConfig::default() };
        let mut recv = Engine::new(EngineConfig {
            local_mac: RECV_MAC,
            local_ip: LocalIp { v4: Some(RECV_IP), v6: None },
            max_qps: cfg.senders,
            ..base
        });
        let rpd = recv.alloc_pd();
        let recv_cq = recv.create_cq(1024).map_err(|x| x.to_string())?;
        let n = cfg.senders as usize;
        let mut flows = Vec::with_capacity(n);
        for i in 0..cfg.senders {
            let mut s = Engine::new(EngineConfig {
                local_mac: sender_mac(i),
                local_ip: LocalIp { v4: Some(sender_ip(i)), v6: None },
                max_qps: 4,
                ..base
            });
            let pd = s.alloc_pd();
            let cq = s.create_cq(cfg.depth * 2 + 8).map_err(|x| x.to_string())?;
            let mr = s.reg_mr(pd, SEND_VA, cfg.msg_size as usize, AccessFlags::ALL).map_err(|x| x.to_string())?;
            let caps = QpCaps { max_send_wr: cfg.depth.max(1), max_recv_wr: 4, ..QpCaps::default() };
            let qpn = s.create_qp(pd, cq, cq, caps).map_err(|x| x.to_string())?;
            let rmr = recv
                .reg_mr(rpd, RECV_VA + (u64::from(i) << 32), cfg.msg_size as usize, AccessFlags::ALL)
                .map_err(|x| x.to_string())?;
            let rqpn = recv.create_qp(rpd, recv_cq, recv_cq, caps).map_err(|x| x.to_string())?;
            let speer = PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: RECV_IP }, mac: RECV_MAC };
            let rpeer = PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: sender_ip(i) }, mac: sender_mac(i) };
            connect(&mut s, qpn, rqpn, speer, cfg.mtu)?;
            connect(&mut recv, rqpn, qpn, rpeer, cfg.mtu)?;
            flows.push(Flow {
                engine: s,
                qpn,
                cq,
                lkey: mr.lkey,
                rkey: rmr.rkey,
                rqpn,
                free_at: Instant::ZERO,
                idle: false,
                posted: 0,
                done: 0,
                start: Instant::ZERO + cfg.start_at.get(i as usize).copied().unwrap_or(Duration::ZERO),
                extra: cfg.extra_delay.get(i as usize).copied().unwrap_or(Duration::ZERO),
            });
        }
        Ok(Incast {
            flows,
            recv,
            recv_cq,
            recv_free_at: Instant::ZERO,
            recv_idle: false,
            up: BinaryHeap::new(),
            down: BinaryHeap::new(),
            back: BinaryHeap::new(),
            sw: Egress {
                queue: VecDeque::new(),
                bytes: 0,
                free_at: Instant::ZERO,
                sent_in_window: 0,
                last_tx: (Instant::ZERO, Instant::ZERO, 0),
                max_bytes: 0,
                area: 0,
                area_at: Instant::ZERO,
                marked: 0,
                drops: 0,
                window_drops: 0,
                in_window: false,
            },
            now: Instant::ZERO,
            rng: SimRng::new(cfg.seed),
            seq: 0,
            buf: vec![0u8; cfg.mtu as usize + MAX_HEADER_BYTES],
            cfg,
        })
    }

    /// Serialisation time of `len` bytes on a link.
    fn ser(&self, len: usize) -> Duration {
        Duration::from_nanos((len as u64 * 8 * 1000).div_ceil(self.cfg.link_mbps))
    }

    fn push(&mut self, which: u8, at: Instant, dst: u32, frame: Vec<u8>) {
        self.seq += 1;
        // Frames of different senders reaching the switch at the same nanosecond are taken in a random (seeded)
        // order: in index order, the senders' lockstep would always put the same flows last into a full buffer.
        let tie = if which == 0 { self.rng.next_u64() & !0xffff_ffff | self.seq & 0xffff_ffff } else { self.seq };
        let q = match which {
            0 => &mut self.up,
            1 => &mut self.down,
            _ => &mut self.back,
        };
        q.push(Reverse((at, tie, dst, frame)));
    }

    /// RED decision for a queue of `q` bytes: true = mark (or drop if Not-ECT).
    fn red(&mut self, q: u64) -> bool {
        let c = &self.cfg;
        if q <= c.kmin_bytes {
            return false;
        }
        if q > c.kmax_bytes {
            return true;
        }
        let span = (c.kmax_bytes - c.kmin_bytes).max(1);
        let p = (u64::from(c.pmax_ppm) * (q - c.kmin_bytes) / span) as u32;
        self.rng.chance_ppm(p)
    }

    /// Marks or drops a frame RED chose; returns false if it was dropped.
    fn apply_mark(&mut self, frame: &mut [u8]) -> bool {
        if mark_ce(frame) {
            self.sw.marked += 1;
            true
        } else {
            self.sw.drop();
            false
        }
    }

    fn account_queue(&mut self) {
        let dt = (self.now - self.sw.area_at).as_nanos();
        self.sw.area += u128::from(self.sw.bytes) * u128::from(dt);
        self.sw.area_at = self.now;
    }

    fn enqueue(&mut self, mut frame: Vec<u8>) {
        self.account_queue();
        let len = frame.len() as u64;
        if self.sw.bytes + len > self.cfg.buffer_bytes {
            self.sw.drop();
            return;
        }
        if !self.cfg.mark_on_dequeue && self.red(self.sw.bytes) && !self.apply_mark(&mut frame) {
            return;
        }
        self.sw.bytes += len;
        self.sw.max_bytes = self.sw.max_bytes.max(self.sw.bytes);
        self.sw.queue.push_back(frame);
    }

    fn process(&mut self, window_start: Instant) {
        let now = self.now;
        self.sw.in_window = now >= window_start;
        // Frames reaching the switch.
        while let Some(Reverse((t, ..))) = self.up.peek() {
            if *t > now {
                break;
            }
            let Reverse((_, _, _, f)) = self.up.pop().expect("peeked");
            self.enqueue(f);
        }
        // The egress port sends while it is free.
        while self.sw.free_at <= now {
            let Some(mut f) = self.sw.queue.pop_front() else { break };
            self.account_queue();
            let q = self.sw.bytes;
            self.sw.bytes -= f.len() as u64;
            if self.cfg.mark_on_dequeue && self.red(q) && !self.apply_mark(&mut f) {
                continue;
            }
            let done = now + self.ser(f.len());
            self.sw.free_at = done;
            let len = f.len() as u64;
            if now >= window_start {
                self.sw.sent_in_window += len;
            } else if done > window_start {
                self.sw.sent_in_window += len * (done - window_start).as_nanos() / (done - now).as_nanos();
            }
            self.sw.last_tx = (now, done, len);
            let at = done + self.cfg.hop_delay;
            self.push(1, at, 0, f);
        }
        // Deliveries to the receiver and back to the senders.
        while let Some(Reverse((t, ..))) = self.down.peek() {
            if *t > now {
                break;
            }
            let Reverse((_, _, _, mut f)) = self.down.pop().expect("peeked");
            self.recv.handle_rx_mut(now, &mut f, RxMeta::default());
            self.recv_idle = false;
        }
        while let Some(Reverse((t, ..))) = self.back.peek() {
            if *t > now {
                break;
            }
            let Reverse((_, _, dst, mut f)) = self.back.pop().expect("peeked");
            let fl = &mut self.flows[dst as usize];
            fl.engine.handle_rx_mut(now, &mut f, RxMeta::default());
            fl.idle = false;
        }
        // Timers.
        if self.recv.poll_timeout().is_some_and(|t| t <= now) {
            self.recv.handle_timeout(now);
            self.recv_idle = false;
        }
        for fl in &mut self.flows {
            if fl.engine.poll_timeout().is_some_and(|t| t <= now) {
                fl.engine.handle_timeout(now);
                fl.idle = false;
            }
        }
        // Transmissions.
        for i in 0..self.flows.len() {
            while !self.flows[i].idle && self.flows[i].free_at <= now {
                let fl = &mut self.flows[i];
                let Some(len) = fl.engine.poll_transmit(now, &mut self.buf) else {
                    fl.idle = true;
                    break;
                };
                let done = now + self.ser(len);
                let fl = &mut self.flows[i];
                fl.free_at = done;
                let at = done + self.cfg.hop_delay + fl.extra;
                let f = self.buf[..len].to_vec();
                self.push(0, at, i as u32, f);
            }
        }
        while !self.recv_idle && self.recv_free_at <= now {
            let Some(len) = self.recv.poll_transmit(now, &mut self.buf) else {
                self.recv_idle = true;
                break;
            };
            let done = now + self.ser(len);
            self.recv_free_at = done;
            // Route by destination MAC (the receiver's QPs each talk to one sender).
            let m = &self.buf[..6];
            let dst = (u32::from(m[4]) << 8) | u32::from(m[5]);
            if m[..4] != [2, 0, 0, 1] || dst as usize >= self.flows.len() {
                continue;
            }
            let at = done + self.cfg.hop_delay + self.cfg.hop_delay + self.flows[dst as usize].extra;
            let f = self.buf[..len].to_vec();
            self.push(2, at, dst, f);
        }
    }

    fn next_event(&self, extra: Instant) -> Instant {
        let now = self.now;
        let mut next = extra;
        for q in [&self.up, &self.down, &self.back] {
            if let Some(Reverse((t, ..))) = q.peek() {
                next = next.min(*t);
            }
        }
        if !self.sw.queue.is_empty() {
            next = next.min(self.sw.free_at.max(now));
        }
        if let Some(t) = self.recv.poll_timeout() {
            next = next.min(t);
        }
        if !self.recv_idle && self.recv.has_pending_tx() {
            next = next.min(self.recv_free_at.max(now));
        }
        for fl in &self.flows {
            if let Some(t) = fl.engine.poll_timeout() {
                next = next.min(t);
            }
            if !fl.idle && fl.engine.has_pending_tx() {
                next = next.min(fl.free_at.max(now));
            }
            if fl.start > now {
                next = next.min(fl.start);
            }
        }
        next
    }

    /// Keeps `depth` WRITEs outstanding on every started flow; checks completions.
    fn post_and_reap(&mut self, failure: &mut Option<String>) {
        let now = self.now;
        let (size, depth) = (self.cfg.msg_size, u64::from(self.cfg.depth));
        let mut cqes = [BLANK; 32];
        for (i, fl) in self.flows.iter_mut().enumerate() {
            loop {
                let n = fl.engine.poll_cq(fl.cq, &mut cqes);
                for c in &cqes[..n] {
                    if c.status != WcStatus::Success {
                        failure.get_or_insert(format!("flow {i}: WRITE {} completed with {:?}", c.wr_id, c.status));
                    }
                    fl.done += 1;
                }
                if n == 0 {
                    break;
                }
            }
            if fl.start > now {
                continue;
            }
            while fl.posted - fl.done < depth {
                let wr = SendWr::new(fl.posted, WrOpcode::RdmaWrite).remote(RECV_VA + ((i as u64) << 32), fl.rkey);
                let sge = Sge { addr: SEND_VA, len: size, lkey: fl.lkey };
                if let Err(e) = fl.engine.post_send(fl.qpn, &wr, &[sge]) {
                    failure.get_or_insert(format!("flow {i}: post_send: {e}"));
                    break;
                }
                fl.posted += 1;
                fl.idle = false;
            }
        }
        // The receiver's CQ only sees completions for WRITE with immediate: none here, but keep it drained.
        while self.recv.poll_cq_one(self.recv_cq).is_some() {}
    }

    /// Runs for the configured duration and reports.
    pub fn run(mut self) -> IncastReport {
        let end = Instant::ZERO + self.cfg.duration;
        let window = Instant::ZERO + self.cfg.measure_from.min(self.cfg.duration);
        let n = self.flows.len();
        let mut rep = IncastReport { flows: vec![FlowReport::default(); n], ..IncastReport::default() };
        for f in &mut rep.flows {
            f.min_rate_kbps = u64::MAX;
        }
        let mut failure = None;
        let mut at_window: Option<Vec<u64>> = None;
        let mut last_sample = vec![0u64; n];
        let every = self.cfg.sample_every;
        let mut next_sample = if every.as_nanos() > 0 { Instant::ZERO } else { Instant::MAX };
        let mut same = 0u32;
        loop {
            self.post_and_reap(&mut failure);
            self.process(window);
            if at_window.is_none() && self.now >= window {
                at_window = Some(self.rx_bytes());
            }
            if self.now >= next_sample {
                let rx = self.rx_bytes();
                for i in 0..n {
                    let st = self.flows[i].engine.qp_cc_state(self.flows[i].qpn).expect("qp");
                    let f = &mut rep.flows[i];
                    f.min_rate_kbps = f.min_rate_kbps.min(st.rate_kbps);
                    f.max_rate_kbps = f.max_rate_kbps.max(st.rate_kbps);
                    rep.trace.push(TraceRow {
                        time_ns: next_sample.as_nanos(),
                        flow: i as u32,
                        rate_kbps: st.rate_kbps,
                        bytes: rx[i] - last_sample[i],
                        queue_bytes: self.sw.bytes,
                    });
                }
                last_sample = rx;
                next_sample += every;
            }
            if failure.is_some() || self.now >= end {
                break;
            }
            let mut wake = end.min(next_sample);
            if window > self.now {
                wake = wake.min(window);
            }
            let next = self.next_event(wake);
            if next <= self.now {
                same += 1;
                if same > 1_000_000 {
                    failure = Some(format!("livelock: virtual time stuck at {}", self.now));
                    break;
                }
                if next < self.now {
                    continue;
                }
            } else {
                same = 0;
            }
            self.now = next.max(self.now);
        }
        self.account_queue();
        let rx = self.rx_bytes();
        let w0 = at_window.unwrap_or_else(|| rx.clone());
        let span = (self.now - window).as_nanos().max(1) as f64;
        let mut goodputs = Vec::with_capacity(n);
        for (i, fl) in self.flows.iter().enumerate() {
            let c = fl.engine.qp_counters(fl.qpn).expect("qp");
            let f = &mut rep.flows[i];
            f.bytes = rx[i] - w0[i];
            f.goodput_gbps = f.bytes as f64 * 8.0 / span;
            f.completed = fl.done;
            f.cnps_rcvd = c.cnp_rcvd;
            f.rate_decreases = c.rate_decreases;
            f.retransmits = c.retransmitted_packets;
            if f.min_rate_kbps == u64::MAX {
                f.min_rate_kbps = 0;
            }
            goodputs.push(f.goodput_gbps);
        }
        rep.jain = jain_index(&goodputs);
        // The part of the last frame still on the wire after the end is not sent yet: counted whole, a window of a
        // few frame times read more than the link can carry (util 1.06 over 10 µs at 25 Gb/s).
        let (start, done, len) = self.sw.last_tx;
        let beyond = if done > self.now { len * (done - self.now).as_nanos() / (done - start).as_nanos() } else { 0 };
        let sent = self.sw.sent_in_window.saturating_sub(beyond);
        rep.util = sent as f64 * 8.0 / (span * self.cfg.link_mbps as f64 / 1000.0);
        rep.max_queue_bytes = self.sw.max_bytes;
        rep.mean_queue_bytes = self.sw.area as f64 / self.now.as_nanos().max(1) as f64;
        rep.cnps_sent = self.recv.qp_totals().cnp_sent;
        rep.marked = self.sw.marked;
        rep.drops = self.sw.drops;
        rep.window_drops = self.sw.window_drops;
        rep.ok = failure.is_none();
        rep.failure = failure;
        rep
    }

    /// Payload bytes the receiver accepted per flow.
    fn rx_bytes(&self) -> Vec<u64> {
        self.flows.iter().map(|f| self.recv.qp_counters(f.rqpn).map_or(0, |c| c.rx_bytes)).collect()
    }
}

const BLANK: Cqe = Cqe {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::RdmaWrite,
    qpn: 0,
    byte_len: 0,
    imm: None,
    invalidated_rkey: None,
    solicited: false,
};

/// Takes a QP from RESET to RTS towards `dest` at `peer` (PSNs 0, all remote access, ACK timeout 4 ms, seven
/// retries).
pub fn connect(e: &mut Engine, qpn: u32, dest: u32, peer: PeerAddr, mtu: u32) -> Result<(), String> {
    let q = |s| QpAttr { state: Some(s), ..QpAttr::default() };
    e.modify_qp(qpn, &QpAttr { access: Some(AccessFlags::ALL), ..q(QpState::Init) }).map_err(|x| x.to_string())?;
    let rtr = QpAttr {
        path_mtu: Some(mtu),
        dest_qpn: Some(dest),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(4),
        peer: Some(peer),
        ..q(QpState::Rtr)
    };
    e.modify_qp(qpn, &rtr).map_err(|x| x.to_string())?;
    let rts = QpAttr { sq_psn: Some(0), timeout: Some(10), retry_cnt: Some(7), rnr_retry: Some(7), ..q(QpState::Rts) };
    e.modify_qp(qpn, &rts).map_err(|x| x.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_for_every_sender_count() {
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000 {
            assert!(seen.insert((sender_ip(i), sender_mac(i).0)), "sender {i}");
            assert_ne!(sender_ip(i), RECV_IP);
            let m = sender_mac(i).0;
            assert_eq!((u32::from(m[4]) << 8) | u32::from(m[5]), i, "the receiver routes by these MAC bytes");
        }
    }

    #[test]
    fn jain_index_bounds() {
        assert_eq!(jain_index(&[3.0, 3.0, 3.0]), 1.0);
        assert!((jain_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert_eq!(jain_index(&[]), 0.0);
    }

    #[test]
    fn ce_marking_rewrites_ecn_and_the_ipv4_checksum_only_for_ect_frames() {
        let mut r = crate::wire::RoceRepr { udp_dst: crate::wire::ROCE_UDP_PORT, ..Default::default() };
        r.ip.ecn = Ecn::Ect0;
        r.ip.dscp = 26;
        let mut buf = vec![0u8; 256];
        let n = crate::wire::emit_frame(&mut buf, &r, 8, |d| d.fill(7)).unwrap();
        let mut f = buf[..n].to_vec();
        assert!(mark_ce(&mut f));
        let p = crate::wire::parse_frame(&f).expect("valid IPv4 checksum after marking");
        assert_eq!((p.repr.ip.ecn, p.repr.ip.dscp, p.icrc_ok), (Ecn::Ce, 26, true));
        r.ip.ecn = Ecn::NotEct;
        let n = crate::wire::emit_frame(&mut buf, &r, 8, |d| d.fill(7)).unwrap();
        let mut f = buf[..n].to_vec();
        assert!(!mark_ce(&mut f));
        assert_eq!(f, buf[..n].to_vec(), "a Not-ECT frame is left alone (the switch drops it instead)");
    }
}
