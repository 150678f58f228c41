//! A scripted peer for QP tests with explicit time (STYLE.md §7.3): one engine with one RC QP in RTS against a
//! remote that exists only as the frames a test writes. Public API only.
//!
//! - [`Peer::rx`] builds an inbound frame (remote -> local, `bth.dest_qp` = the local QPN) with
//!   `wire::emit_frame` and hands it to `handle_rx_mut` at the peer's current time.
//! - [`Peer::tx`] drains `poll_transmit` into parsed frames and checks the addressing of every one.
//! - [`Peer::advance`] / [`Peer::fire`] move time and run timers; nothing happens between calls.
//! - Regions: `data` (64 KiB, every right) between two guard regions with no rights and a fixed pattern; tests
//!   check the guards with [`Peer::assert_guards`].

#![allow(dead_code, unreachable_pub)]

use roce_dp::wire::{
    self, emit_frame, parse_frame, AethKind, AethRepr, AtomicEthRepr, BthRepr, ExtRepr, IpAddrs, MacAddr, NakCode,
    Opcode, Psn, RethRepr, RoceRepr,
};
use roce_dp::{
    AccessFlags, AckPolicy, CqId, Cqe, Duration, Engine, EngineConfig, Instant, LocalIp, MrKeys, Pd, PeerAddr, QpAttr,
    QpCaps, QpState, RxMeta, SendWr, Sge, WcOpcode, WcStatus, WrOpcode,
};
use std::fmt;

pub const LOCAL_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x01]);
pub const REMOTE_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x02]);
pub const LOCAL_IP: [u8; 4] = [10, 0, 0, 1];
pub const REMOTE_IP: [u8; 4] = [10, 0, 0, 2];
/// The scripted remote's QP number.
pub const REMOTE_QPN: u32 = 0x0077;
/// Virtual address and size of the data region; guards of GUARD_LEN bytes sit right below and above it.
pub const DATA_VA: u64 = 0x10_0000;
pub const DATA_LEN: usize = 64 * 1024;
pub const GUARD_LEN: usize = 4096;
pub const GUARD_BYTE: u8 = 0xa5;
/// A frame buffer big enough for any path MTU.
pub const BUF_LEN: usize = 4096 + roce_dp::engine::MAX_HEADER_BYTES;

/// How the QP under test is configured.
#[derive(Clone, Copy, Debug)]
pub struct PeerCfg {
    pub mtu: u32,
    /// The local requester's first PSN.
    pub sq_psn: u32,
    /// The PSN the local responder expects first (the remote's first PSN).
    pub rq_psn: u32,
    /// Local ACK timeout exponent (4.096 µs * 2^t).
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub access: AccessFlags,
    pub ack: AckPolicy,
    pub ack_req_every: u32,
    pub max_unacked_psns: u32,
    pub caps: QpCaps,
    /// Depth of the send and the receive CQ.
    pub cq_depth: u32,
    /// EngineConfig::retry_cnt_7_infinite (rxe's reading of retry_cnt = 7).
    pub retry_cnt_7_infinite: bool,
}

impl Default for PeerCfg {
    fn default() -> Self {
        PeerCfg {
            mtu: 1024,
            sq_psn: 0x10_0000,
            rq_psn: 0x20_0000,
            timeout: 10,
            retry_cnt: 3,
            rnr_retry: 3,
            min_rnr_timer: 4,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            access: AccessFlags::ALL,
            ack: AckPolicy::default(),
            ack_req_every: 64,
            max_unacked_psns: 256,
            caps: QpCaps::default(),
            cq_depth: 4096,
            retry_cnt_7_infinite: false,
        }
    }
}

impl PeerCfg {
    /// The local ACK timeout this configuration gives.
    pub fn ack_timeout(&self) -> Duration {
        Duration::from_nanos(4096u64 << self.timeout)
    }
}

/// One frame the engine sent, parsed.
#[derive(Clone, Debug)]
pub struct Out {
    pub repr: RoceRepr,
    pub payload: Vec<u8>,
    pub raw: Vec<u8>,
}

impl Out {
    pub fn op(&self) -> Opcode {
        self.repr.bth.opcode
    }
    pub fn psn(&self) -> u32 {
        self.repr.bth.psn.value()
    }
    pub fn aeth(&self) -> AethRepr {
        self.repr.ext.aeth.unwrap_or_else(|| panic!("no AETH in {self}"))
    }
    pub fn reth(&self) -> RethRepr {
        self.repr.ext.reth.unwrap_or_else(|| panic!("no RETH in {self}"))
    }
}

impl fmt::Display for Out {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        summary(f, &self.repr, self.payload.len())
    }
}

/// One line per frame: opcode, PSN, AckReq, and the extension headers that matter.
pub fn summary(f: &mut impl fmt::Write, r: &RoceRepr, payload: usize) -> fmt::Result {
    let b = &r.bth;
    write!(f, "{} psn={:#08x}{}", b.opcode.name(), b.psn.value(), if b.ack_req { " A" } else { "" })?;
    if let Some(a) = r.ext.aeth {
        write!(f, " aeth(syn={:#04x} msn={})", a.syndrome, a.msn)?;
    }
    if let Some(x) = r.ext.reth {
        write!(f, " reth(va={:#x} rkey={:#x} len={})", x.va, x.rkey, x.len)?;
    }
    if let Some(x) = r.ext.atomic_eth {
        write!(f, " atomic(va={:#x} rkey={:#x} swap_add={:#x} cmp={:#x})", x.va, x.rkey, x.swap_add, x.compare)?;
    }
    if let Some(x) = r.ext.atomic_ack {
        write!(f, " orig={x:#x}")?;
    }
    if payload > 0 {
        write!(f, " +{payload}B")?;
    }
    Ok(())
}

/// Joins frame summaries for assertion messages.
pub fn show(v: &[Out]) -> String {
    let s: Vec<String> = v.iter().map(|o| o.to_string()).collect();
    format!("[{}]", s.join(", "))
}

/// An inbound request or response the test scripts.
#[derive(Clone, Debug)]
pub struct Pkt {
    pub bth: BthRepr,
    pub ext: ExtRepr,
    pub payload: Vec<u8>,
}

impl Pkt {
    pub fn new(opcode: Opcode, psn: u32) -> Pkt {
        Pkt {
            bth: BthRepr { opcode, psn: Psn::new(psn), ..BthRepr::default() },
            ext: ExtRepr::default(),
            payload: vec![],
        }
    }
    pub fn ack_req(mut self) -> Pkt {
        self.bth.ack_req = true;
        self
    }
    pub fn payload(mut self, p: &[u8]) -> Pkt {
        self.payload = p.to_vec();
        self
    }
    /// `n` bytes of a recognizable pattern starting at message offset `off`.
    pub fn fill(self, off: usize, n: usize) -> Pkt {
        let p: Vec<u8> = (off..off + n).map(pattern).collect();
        self.payload(&p)
    }
    pub fn reth(mut self, va: u64, rkey: u32, len: u32) -> Pkt {
        self.ext.reth = Some(RethRepr { va, rkey, len });
        self
    }
    pub fn aeth(mut self, syndrome: u8, msn: u32) -> Pkt {
        self.ext.aeth = Some(AethRepr { syndrome, msn });
        self
    }
    pub fn atomic(mut self, va: u64, rkey: u32, swap_add: u64, compare: u64) -> Pkt {
        self.ext.atomic_eth = Some(AtomicEthRepr { va, rkey, swap_add, compare });
        self
    }
    pub fn atomic_ack(mut self, orig: u64) -> Pkt {
        self.ext.atomic_ack = Some(orig);
        self
    }
    pub fn imm(mut self, v: u32) -> Pkt {
        self.ext.imm = Some(v);
        self
    }
    pub fn ieth(mut self, rkey: u32) -> Pkt {
        self.ext.ieth = Some(rkey);
        self
    }
    pub fn dest_qp(mut self, qpn: u32) -> Pkt {
        self.bth.dest_qp = qpn;
        self
    }
}

/// Shorthands for the responses a remote responder sends.
pub fn ack(psn: u32, msn: u32) -> Pkt {
    Pkt::new(Opcode::RC_ACKNOWLEDGE, psn).aeth(AethRepr::ACK_UNLIMITED, msn)
}
pub fn nak(psn: u32, code: NakCode, msn: u32) -> Pkt {
    Pkt::new(Opcode::RC_ACKNOWLEDGE, psn).aeth(AethRepr::nak(code, 0).syndrome, msn)
}
pub fn rnr_nak(psn: u32, timer: u8, msn: u32) -> Pkt {
    Pkt::new(Opcode::RC_ACKNOWLEDGE, psn).aeth(AethRepr::rnr_nak(timer, 0).syndrome, msn)
}

/// Byte `i` of the test pattern.
pub fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(7).wrapping_add(i >> 8).wrapping_add(3)) as u8
}

/// The engine under test with one QP and its regions, and the current time.
pub struct Peer {
    pub eng: Engine,
    pub cfg: PeerCfg,
    pub qpn: u32,
    pub pd: Pd,
    pub scq: CqId,
    pub rcq: CqId,
    pub data: MrKeys,
    pub guards: [MrKeys; 2],
    pub now: Instant,
    pub remote_qpn: u32,
}

impl Peer {
    pub fn new() -> Peer {
        Peer::with(PeerCfg::default())
    }

    pub fn with(cfg: PeerCfg) -> Peer {
        let ecfg = EngineConfig {
            local_mac: LOCAL_MAC,
            local_ip: LocalIp { v4: Some(LOCAL_IP), v6: None },
            qpn_base: 0x11,
            ack: cfg.ack,
            ack_req_every: cfg.ack_req_every,
            max_unacked_psns: cfg.max_unacked_psns,
            retry_cnt_7_infinite: cfg.retry_cnt_7_infinite,
            ..EngineConfig::default()
        };
        let mut eng = Engine::new(ecfg);
        let pd = eng.alloc_pd();
        let g0 = eng.reg_mr(pd, DATA_VA - GUARD_LEN as u64, GUARD_LEN, AccessFlags::NONE).unwrap();
        let data = eng.reg_mr(pd, DATA_VA, DATA_LEN, AccessFlags::ALL).unwrap();
        let g1 = eng.reg_mr(pd, DATA_VA + DATA_LEN as u64, GUARD_LEN, AccessFlags::NONE).unwrap();
        for g in [g0, g1] {
            eng.mr_bytes_mut(g.lkey).unwrap().fill(GUARD_BYTE);
        }
        let scq = eng.create_cq(cfg.cq_depth).unwrap();
        let rcq = eng.create_cq(cfg.cq_depth).unwrap();
        let qpn = eng.create_qp(pd, scq, rcq, cfg.caps).unwrap();
        let mut p =
            Peer { eng, cfg, qpn, pd, scq, rcq, data, guards: [g0, g1], now: Instant::ZERO, remote_qpn: REMOTE_QPN };
        p.bring_up();
        p
    }

    /// RESET -> INIT -> RTR -> RTS with the configured attributes.
    pub fn bring_up(&mut self) {
        let c = self.cfg;
        let q = self.qpn;
        self.eng
            .modify_qp(q, &QpAttr { state: Some(QpState::Init), access: Some(c.access), ..QpAttr::default() })
            .unwrap();
        self.eng.modify_qp(q, &self.rtr_attr()).unwrap();
        self.eng.modify_qp(q, &self.rts_attr()).unwrap();
        assert_eq!(self.state(), QpState::Rts);
    }

    pub fn rtr_attr(&self) -> QpAttr {
        let c = self.cfg;
        QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(c.mtu),
            dest_qpn: Some(self.remote_qpn),
            rq_psn: Some(c.rq_psn),
            max_dest_rd_atomic: Some(c.max_dest_rd_atomic),
            min_rnr_timer: Some(c.min_rnr_timer),
            peer: Some(PeerAddr { ip: IpAddrs::V4 { src: LOCAL_IP, dst: REMOTE_IP }, mac: REMOTE_MAC }),
            ..QpAttr::default()
        }
    }

    pub fn rts_attr(&self) -> QpAttr {
        let c = self.cfg;
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(c.sq_psn),
            timeout: Some(c.timeout),
            retry_cnt: Some(c.retry_cnt),
            rnr_retry: Some(c.rnr_retry),
            max_rd_atomic: Some(c.max_rd_atomic),
            ..QpAttr::default()
        }
    }

    pub fn state(&self) -> QpState {
        self.eng.query_qp(self.qpn).unwrap().state
    }

    // ------------------------------------------------------------------ inbound

    /// The frame the remote would send: remote -> local, to the local QP unless `pkt` names another.
    pub fn frame(&self, pkt: &Pkt) -> Vec<u8> {
        self.frame_from(pkt, REMOTE_IP)
    }

    /// [`frame`](Self::frame) from IPv4 source `src` (the peer's address, or a stranger's).
    pub fn frame_from(&self, pkt: &Pkt, src: [u8; 4]) -> Vec<u8> {
        let mut bth = pkt.bth;
        if bth.dest_qp == 0 {
            bth.dest_qp = self.qpn;
        }
        let mut repr = RoceRepr {
            bth,
            ext: pkt.ext,
            udp_src: wire::rxe_udp_sport(self.remote_qpn, self.qpn),
            udp_dst: wire::ROCE_UDP_PORT,
            ..RoceRepr::default()
        };
        repr.eth.src = REMOTE_MAC;
        repr.eth.dst = LOCAL_MAC;
        repr.ip.addrs = IpAddrs::V4 { src, dst: LOCAL_IP };
        repr.ip.ttl = 64;
        repr.ip.dont_frag = true;
        let mut buf = vec![0u8; BUF_LEN + 64];
        let n = emit_frame(&mut buf, &repr, pkt.payload.len(), |d| d.copy_from_slice(&pkt.payload))
            .unwrap_or_else(|e| panic!("cannot emit the scripted frame {pkt:?}: {e}"));
        buf.truncate(n);
        buf
    }

    /// Delivers a scripted frame now.
    pub fn rx(&mut self, pkt: Pkt) {
        let f = self.frame(&pkt);
        self.rx_raw(&f);
    }

    /// Delivers raw bytes now, through `handle_rx_mut` (the entry point of callers that own the frame's buffer;
    /// the read-only `handle_rx` takes the same frames in `rx_raw_shared`), and checks that the frame's bytes are
    /// as they were when it returns.
    pub fn rx_raw(&mut self, frame: &[u8]) {
        let mut f = frame.to_vec();
        self.eng.handle_rx_mut(self.now, &mut f, RxMeta::default());
        assert!(f == frame, "handle_rx_mut left the frame changed: {frame:02x?} -> {f:02x?}");
    }

    /// Delivers raw bytes now through the read-only `handle_rx`.
    pub fn rx_raw_shared(&mut self, frame: &[u8]) {
        self.eng.handle_rx(self.now, frame, RxMeta::default());
    }

    // ------------------------------------------------------------------ outbound

    /// Everything the engine sends now, parsed; every frame must be well formed, carry a valid ICRC and be
    /// addressed local -> remote.
    pub fn tx(&mut self) -> Vec<Out> {
        let mut v = Vec::new();
        let mut buf = vec![0u8; BUF_LEN];
        while let Some(n) = self.eng.poll_transmit(self.now, &mut buf) {
            let raw = buf[..n].to_vec();
            let f = parse_frame(&raw).unwrap_or_else(|e| panic!("engine sent a frame it cannot parse: {e}"));
            assert!(f.icrc_ok, "engine sent a bad ICRC");
            assert_eq!(f.repr.ip.addrs, IpAddrs::V4 { src: LOCAL_IP, dst: REMOTE_IP });
            assert_eq!((f.repr.eth.src, f.repr.eth.dst), (LOCAL_MAC, REMOTE_MAC));
            assert_eq!(f.repr.bth.dest_qp, self.remote_qpn);
            assert_eq!(f.repr.udp_dst, wire::ROCE_UDP_PORT);
            v.push(Out { repr: f.repr, payload: f.payload.to_vec(), raw: raw.clone() });
            assert!(v.len() < 100_000, "poll_transmit never returns None");
        }
        v
    }

    /// Exactly one frame now.
    pub fn tx_one(&mut self) -> Out {
        let mut v = self.tx();
        assert_eq!(v.len(), 1, "expected exactly one frame, got {}", show(&v));
        v.pop().unwrap()
    }

    /// Nothing to send now.
    pub fn tx_nothing(&mut self) {
        let v = self.tx();
        assert!(v.is_empty(), "expected no frame at {:?}, got {}", self.now, show(&v));
    }

    /// Exactly one ACK-type frame (ACK/NAK/RNR NAK) with this PSN, syndrome and MSN.
    pub fn expect_ack(&mut self, psn: u32, syndrome: u8, msn: u32) {
        let o = self.tx_one();
        assert_eq!(o.op(), Opcode::RC_ACKNOWLEDGE, "expected an ACK, got {o}");
        assert_eq!((o.psn(), o.aeth().syndrome, o.aeth().msn), (psn, syndrome, msn), "got {o}");
    }

    /// Exactly one NAK of this code for `psn`.
    pub fn expect_nak(&mut self, psn: u32, code: NakCode) {
        let o = self.tx_one();
        assert_eq!(o.op(), Opcode::RC_ACKNOWLEDGE, "expected a NAK, got {o}");
        assert_eq!(o.aeth().kind(), AethKind::Nak(code), "got {o}");
        assert_eq!(o.psn(), psn, "NAK PSN, got {o}");
    }

    // ------------------------------------------------------------------ time

    /// Moves time to `t`, running every timer due on the way at its own deadline.
    pub fn advance_to(&mut self, t: Instant) {
        while let Some(d) = self.eng.poll_timeout() {
            if d > t {
                break;
            }
            self.now = self.now.max(d);
            self.eng.handle_timeout(self.now);
        }
        self.now = self.now.max(t);
    }

    pub fn advance(&mut self, d: Duration) {
        let t = self.now + d;
        self.advance_to(t);
    }

    /// Jumps to the next deadline and runs it; returns it.
    pub fn fire(&mut self) -> Instant {
        let d = self.eng.poll_timeout().expect("no timer armed");
        assert!(d >= self.now, "deadline {d:?} is in the past (now {:?})", self.now);
        self.now = d;
        self.eng.handle_timeout(d);
        d
    }

    pub fn deadline(&self) -> Option<Instant> {
        self.eng.poll_timeout()
    }

    // ------------------------------------------------------------------ verbs

    pub fn post(&mut self, wr: SendWr, sgl: &[Sge]) {
        self.eng.post_send(self.qpn, &wr, sgl).unwrap_or_else(|e| panic!("post_send {wr:?}: {e}"));
    }

    /// A SEND of `len` bytes from the data region at `off`.
    pub fn post_send(&mut self, wr_id: u64, off: u64, len: u32) {
        let s = self.sge(off, len);
        self.post(SendWr::new(wr_id, WrOpcode::Send), &[s]);
    }

    /// An RDMA WRITE of `len` bytes from the data region at `off` to the remote `va`/`rkey`.
    pub fn post_write(&mut self, wr_id: u64, off: u64, len: u32, va: u64, rkey: u32) {
        let s = self.sge(off, len);
        self.post(SendWr::new(wr_id, WrOpcode::RdmaWrite).remote(va, rkey), &[s]);
    }

    /// An RDMA READ of `len` bytes into the data region at `off`.
    pub fn post_read(&mut self, wr_id: u64, off: u64, len: u32, va: u64, rkey: u32) {
        let s = self.sge(off, len);
        self.post(SendWr::new(wr_id, WrOpcode::RdmaRead).remote(va, rkey), &[s]);
    }

    pub fn post_fetch_add(&mut self, wr_id: u64, off: u64, va: u64, rkey: u32, add: u64) {
        let s = self.sge(off, 8);
        let mut wr = SendWr::new(wr_id, WrOpcode::AtomicFetchAdd).remote(va, rkey);
        wr.compare_add = add;
        self.post(wr, &[s]);
    }

    pub fn post_recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let s = self.sge(off, len);
        self.eng.post_recv(self.qpn, wr_id, &[s]).unwrap();
    }

    /// An SGE in the data region.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge { addr: DATA_VA + off, len, lkey: self.data.lkey }
    }

    /// Every completion waiting, send CQ then receive CQ.
    pub fn cqes(&mut self) -> Vec<Cqe> {
        let mut v = Vec::new();
        for cq in [self.scq, self.rcq] {
            while let Some(c) = self.eng.poll_cq_one(cq) {
                v.push(c);
            }
        }
        v
    }

    /// Exactly these (wr_id, status) completions, in this order.
    pub fn expect_cqes(&mut self, want: &[(u64, WcStatus)]) -> Vec<Cqe> {
        let got = self.cqes();
        let ids: Vec<(u64, WcStatus)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(ids, want, "completions: {got:?}");
        got
    }

    pub fn no_cqes(&mut self) {
        let got = self.cqes();
        assert!(got.is_empty(), "unexpected completions {got:?}");
    }

    // ------------------------------------------------------------------ memory

    pub fn data(&self) -> &[u8] {
        self.eng.mr_bytes(self.data.lkey).unwrap()
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        self.eng.mr_bytes_mut(self.data.lkey).unwrap()
    }

    /// Fills the data region with the test pattern (byte i = pattern(i)).
    pub fn fill_data(&mut self) {
        for (i, b) in self.data_mut().iter_mut().enumerate() {
            *b = pattern(i);
        }
    }

    pub fn assert_guards(&self) {
        for g in self.guards {
            let b = self.eng.mr_bytes(g.lkey).expect("guard region gone");
            assert!(b.iter().all(|&x| x == GUARD_BYTE), "a guard region next to the data region was written");
        }
    }

    pub fn counters(&self) -> roce_dp::QpCounters {
        self.eng.qp_counters(self.qpn).unwrap()
    }
}

impl Default for Peer {
    fn default() -> Self {
        Peer::new()
    }
}

/// Receive completion shorthand check.
pub fn assert_recv(c: &Cqe, wr_id: u64, byte_len: u32) {
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len),
        (wr_id, WcStatus::Success, WcOpcode::Recv, byte_len),
        "{c:?}"
    );
}

/// The IPv4 identification of an untagged frame.
pub fn ip_id(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[18], frame[19]])
}

/// `frame` (untagged IPv4) with its IP identification set to `id`, and the IPv4 header checksum and the ICRC (which
/// covers the identification) recomputed. Comparing `with_ip_id(a, ip_id(b))` with `b` compares every other bit.
pub fn with_ip_id(frame: &[u8], id: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[18..20].copy_from_slice(&id.to_be_bytes());
    let total = usize::from(u16::from_be_bytes([f[16], f[17]]));
    let mut ip = wire::Ipv4Packet::new_unchecked(&mut f[14..34]);
    ip.fill_checksum();
    wire::icrc::fill(&mut f[14..14 + total]).expect("icrc");
    f
}
