//! A hostile peer against the engine's requester and completer: it watches the requests the engine sends and
//! answers with responses that look valid but are not what a responder would send: ACKs for PSNs never requested
//! (the future, the past, the middle of a READ), READ responses longer or shorter than asked or of the wrong shape,
//! READ responses and atomic ACKs for PSNs that are SENDs or WRITEs, duplicate atomic ACKs with different original
//! values, NAK storms of every code (reserved ones too), RNR NAK loops with every timer value, garbage MSNs; mixed
//! with honest answers, with time advancing by random steps (timers fire on the way) and with WRs posted meanwhile.
//! Meanwhile the peer sends requests of its own to the engine's responder (every request opcode, in and out of
//! sequence, RETH/AtomicETH at the data region, its guards, its end, wrapping around), and the application modifies the running QP (path MTU, PSNs, destination QP, timeouts, retry counts,
//! rights; through SQD and back sometimes), as a daemon client's ModifyQp can. Then the peer either goes silent or
//! answers honestly for a while, and time runs on.
//!
//! The rule (issues 4 and 7): a posted WR always ends: it completes, or the QP goes to ERR and flushes it. Every
//! send WR has exactly one completion, in posting order; an error completion means the QP is in ERR; no byte is
//! written outside the data region (guards without rights sit beside it); every frame the engine sends is well
//! formed. With retry_cnt and rnr_retry below 7 every run must end within a bounded virtual time.
//!
//! Seeded: `ROCE_HOSTILE_SEED`, `ROCE_HOSTILE_ITERS` (default 400), `ROCE_HOSTILE_SOAK=1` (100x); a failure
//! prints its seed (`ROCE_HOSTILE_SEED=<seed> ROCE_HOSTILE_ITERS=1` replays it).

mod harness;
mod seeded;

use harness::*;
use roce_dp::sim::SimRng;
use roce_dp::wire::{op, AethRepr, NakCode, Opcode};
use roce_dp::{Duration, QpAttr, QpState, SendWr, WcStatus, WrOpcode};
use seeded::Seeds;

/// A request the engine sent: PSN, opcode, and for a READ the length it asked for.
#[derive(Clone, Copy, Debug)]
struct Sent {
    psn: u32,
    op: Opcode,
    read_len: u32,
}

struct Adversary {
    rng: SimRng,
    mtu: u32,
    /// Every request seen (first transmissions and retransmissions), most recent last.
    seen: Vec<Sent>,
    /// One past the highest PSN seen.
    max_psn: Option<u32>,
}

fn psn(v: u32) -> u32 {
    v & 0xff_ffff
}

impl Adversary {
    /// A request to the engine's responder (the peer is a requester too): in sequence or near it, every request
    /// opcode, RETH/AtomicETH at the data region, its guards, its end or wrapping, lengths around the MTU.
    fn request(&mut self, expected: u32, keys: &[u32]) -> Pkt {
        let r = &mut self.rng;
        let opc = Opcode(
            [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x13, 0x14, 0x16, 0x17]
                [r.below(17) as usize],
        );
        let p = if r.below(4) == 0 { psn(expected.wrapping_add(r.below(5) as u32).wrapping_sub(2)) } else { expected };
        let mtu = self.mtu as usize;
        let len = match r.below(5) {
            0 => 0,
            1 => mtu,
            2 => mtu + 1,
            3 => 1 + r.below(mtu as u64) as usize,
            _ => r.below(64) as usize,
        };
        let key = keys[r.below(keys.len() as u64) as usize];
        let va = match r.below(6) {
            0 => DATA_VA - 8,
            1 => DATA_VA + DATA_LEN as u64 - (r.below(16) & !7),
            2 => u64::MAX - 7,
            _ => DATA_VA + (r.below(DATA_LEN as u64) & !7),
        };
        let dma = [0, 8, self.mtu, 3 * self.mtu, u32::MAX, 1 << 31, len as u32][r.below(7) as usize];
        let mut pkt = Pkt::new(opc, p);
        pkt.bth.ack_req = r.below(2) == 0;
        let f = opc.flags();
        if f & op::RETH != 0 {
            pkt = pkt.reth(va, key, dma);
        }
        if f & op::ATOMIC_ETH != 0 {
            pkt = pkt.atomic(va, key, r.next_u64(), r.next_u64());
        }
        if f & op::IMM_DT != 0 {
            pkt = pkt.imm(r.next_u64() as u32);
        }
        if f & op::IETH != 0 {
            pkt = pkt.ieth(key);
        }
        if f & op::PAYLOAD != 0 {
            pkt = pkt.fill(0, len);
        }
        pkt
    }

    fn pick(&mut self) -> Option<Sent> {
        if self.seen.is_empty() {
            return None;
        }
        let n = self.seen.len() as u64;
        // Mostly recent requests.
        let i = if self.rng.below(2) == 0 { n - 1 - self.rng.below(n.min(8)) } else { self.rng.below(n) };
        Some(self.seen[i as usize])
    }

    /// A PSN near what was requested: the past, the future, just past the last one, random.
    fn any_psn(&mut self, base: u32) -> u32 {
        let top = self.max_psn.unwrap_or(base);
        psn(match self.rng.below(8) {
            0 => top,
            1 => top + 1 + self.rng.below(4) as u32,
            2 => base.wrapping_sub(1 + self.rng.below(4) as u32),
            3 => base ^ 0x80_0000,
            4 => self.rng.next_u64() as u32,
            5 => top.wrapping_sub(1),
            _ => base + self.rng.below(3) as u32,
        })
    }

    fn msn(&mut self) -> u32 {
        if self.rng.below(3) == 0 {
            self.rng.next_u64() as u32 & 0xff_ffff
        } else {
            self.rng.below(8) as u32
        }
    }

    /// The honest answer to one request.
    fn honest(&mut self, s: Sent) -> Vec<Pkt> {
        let f = s.op.flags();
        if f & op::READ != 0 {
            let n = s.read_len.div_ceil(self.mtu).max(1);
            return (0..n)
                .map(|k| {
                    let len = (s.read_len - (k * self.mtu).min(s.read_len)).min(self.mtu) as usize;
                    let opc = match (k == 0, k + 1 == n) {
                        (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                        (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                        (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                        _ => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    };
                    let p = Pkt::new(opc, psn(s.psn + k)).fill(k as usize * 100, len);
                    if k == 0 || k + 1 == n {
                        p.aeth(AethRepr::ACK_UNLIMITED, 1)
                    } else {
                        p
                    }
                })
                .collect();
        }
        if f & op::ATOMIC != 0 {
            return vec![Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, s.psn)
                .aeth(AethRepr::ACK_UNLIMITED, 1)
                .atomic_ack(self.rng.next_u64())];
        }
        if s.op.flags() & op::LAST != 0 || self.rng.below(4) == 0 {
            return vec![ack(s.psn, 1)];
        }
        vec![]
    }

    /// One hostile answer (or a burst of them).
    fn hostile(&mut self) -> Vec<Pkt> {
        let Some(s) = self.pick() else { return vec![] };
        let mut v = Vec::new();
        match self.rng.below(16) {
            0 => {
                let p = self.any_psn(s.psn);
                let m = self.msn();
                v.push(ack(p, m));
            }
            1 => {
                // A NAK storm of one code at one PSN.
                let code =
                    [NakCode::PsnSeqErr, NakCode::InvalidRequest, NakCode::RemoteAccessErr, NakCode::RemoteOpErr]
                        [self.rng.below(4) as usize];
                let p = if self.rng.below(2) == 0 { s.psn } else { self.any_psn(s.psn) };
                for _ in 0..1 + self.rng.below(40) {
                    v.push(nak(p, code, 0));
                }
            }
            2 | 3 => {
                // RNR NAK loops, every timer value (0 is the longest, 655 ms).
                let t = self.rng.below(32) as u8;
                for _ in 0..1 + self.rng.below(3) {
                    v.push(rnr_nak(s.psn, t, 0));
                }
            }
            4 => {
                // AETH syndromes of every kind, reserved ones included.
                let syn = self.rng.next_u64() as u8;
                v.push(Pkt::new(Opcode::RC_ACKNOWLEDGE, self.any_psn(s.psn)).aeth(syn, self.msn()));
            }
            5 | 6 => {
                // A READ response for a PSN that is no READ, or of the wrong length or shape.
                let opc = [
                    Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    Opcode::RC_RDMA_READ_RESPONSE_LAST,
                ][self.rng.below(4) as usize];
                let len = match self.rng.below(5) {
                    0 => 0,
                    1 => self.mtu as usize,
                    2 => self.mtu as usize + 1,
                    3 => s.read_len as usize + 1,
                    _ => self.rng.below(u64::from(self.mtu)) as usize,
                }
                .min(4096);
                let p = if self.rng.below(2) == 0 { s.psn } else { self.any_psn(s.psn) };
                let mut r = Pkt::new(opc, p).fill(0, len);
                if opc != Opcode::RC_RDMA_READ_RESPONSE_MIDDLE {
                    r = r.aeth(if self.rng.below(4) == 0 { 0x60 } else { AethRepr::ACK_UNLIMITED }, self.msn());
                }
                v.push(r);
            }
            7 => {
                // Atomic ACKs for any PSN, and the same one twice with different original values.
                let p = if self.rng.below(2) == 0 { s.psn } else { self.any_psn(s.psn) };
                for _ in 0..1 + self.rng.below(2) {
                    let orig = self.rng.next_u64();
                    v.push(
                        Pkt::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, p).aeth(AethRepr::ACK_UNLIMITED, 1).atomic_ack(orig),
                    );
                }
            }
            8 => {
                // Honest answers, but out of order and duplicated.
                let mut h = self.honest(s);
                if let Some(s2) = self.pick() {
                    h.extend(self.honest(s2));
                }
                let n = h.len();
                for i in 0..n {
                    let j = self.rng.below(n as u64) as usize;
                    h.swap(i, j);
                }
                if n > 0 && self.rng.below(2) == 0 {
                    let d = h[self.rng.below(n as u64) as usize].clone();
                    h.push(d);
                }
                v = h;
            }
            9 => {
                // The honest READ response, one byte longer or shorter at its last packet.
                let mut h = self.honest(s);
                if let Some(last) = h.last_mut().filter(|l| l.bth.opcode.flags() & op::PAYLOAD != 0) {
                    if self.rng.below(2) == 0 || last.payload.is_empty() {
                        last.payload.push(0xab);
                    } else {
                        last.payload.pop();
                    }
                }
                v = h;
            }
            10 => {
                // A response opcode the completer does not expect at all (a request, a CNP-like op).
                let opc = Opcode(self.rng.below(0x1e) as u8);
                if opc.info().is_some() && opc.flags() & op::REQ == 0 {
                    let mut p = Pkt::new(opc, s.psn);
                    if opc.flags() & op::AETH != 0 {
                        p = p.aeth(AethRepr::ACK_UNLIMITED, 0);
                    }
                    if opc.flags() & op::PAYLOAD != 0 {
                        p = p.fill(0, 8);
                    }
                    v.push(p);
                }
            }
            _ => v = self.honest(s),
        }
        v
    }
}

#[derive(Default, Debug)]
struct Cover {
    requests_in: u64,
    wrs: u64,
    success: u64,
    errors: u64,
    qp_err: u64,
    rnr: u64,
    bad_responses: u64,
}

fn run(seed: u64, cov: &mut Cover) -> Result<(), String> {
    let mut rng = SimRng::new(seed);
    let mtu = [256, 1024, 4096][rng.below(3) as usize];
    let cfg = PeerCfg {
        mtu,
        timeout: 4 + rng.below(6) as u8,
        retry_cnt: rng.below(7) as u8,
        rnr_retry: rng.below(7) as u8,
        max_rd_atomic: 1 + rng.below(4) as u8,
        max_unacked_psns: 4 + rng.below(200) as u32,
        ack_req_every: 1 + rng.below(16) as u32,
        sq_psn: [0xff_fff0, 0x7f_fffe, rng.below(1 << 24) as u32][rng.below(3) as usize],
        rq_psn: [0xff_fffe, rng.below(1 << 24) as u32][rng.below(2) as usize],
        max_dest_rd_atomic: 1 + rng.below(4) as u8,
        ack: if rng.below(2) == 0 {
            roce_dp::AckPolicy::default()
        } else {
            roce_dp::AckPolicy { max_pkts: 1 + rng.below(8) as u32, max_delay: Duration::from_micros(rng.below(50)) }
        },
        ..PeerCfg::default()
    };
    let mut p = Peer::with(cfg);
    let mut adv = Adversary { rng: SimRng::new(seed ^ 0xadad), mtu, seen: Vec::new(), max_psn: None };
    let mut posted = 0u64;
    let recvs = 16u64;
    for k in 0..recvs {
        p.post_recv(1000 + k, 40_000 + k * 1024, 1024);
    }
    let post = |p: &mut Peer, rng: &mut SimRng, posted: &mut u64| {
        if p.state() != QpState::Rts {
            return;
        }
        for _ in 0..rng.below(4) {
            let op = [
                WrOpcode::Send,
                WrOpcode::RdmaWrite,
                WrOpcode::RdmaWriteWithImm,
                WrOpcode::RdmaRead,
                WrOpcode::AtomicFetchAdd,
                WrOpcode::AtomicCmpSwp,
            ][rng.below(6) as usize];
            let len = if op.is_atomic() { 8 } else { rng.below(3 * u64::from(mtu) + 9) as u32 };
            let off = rng.below((DATA_LEN - 3 * 4096 - 16) as u64) & !7;
            let mut wr = SendWr::new(*posted, op).remote(0x9000_0000 + off, 0x1234);
            wr.fence = rng.below(8) == 0;
            let s = p.sge(off, len);
            if trace() {
                eprintln!("{:>12} post {wr:?} len {len}", p.now.0);
            }
            if p.eng.post_send(p.qpn, &wr, &[s]).is_ok() {
                *posted += 1;
            }
        }
    };
    let steps = 20 + rng.below(120);
    let honest_after = rng.below(2) == 0;
    // In a third of the runs the peer sends requests too (they end most of those runs in ERR early).
    let requests = rng.below(3) == 0;
    let mut t = 0;
    loop {
        t += 1;
        let hostile = t <= steps;
        if trace() {
            eprintln!("{:>12} step {t} of {steps} ({})", p.now.0, if hostile { "hostile" } else { "after" });
        }
        if hostile && t % 8 == 1 {
            post(&mut p, &mut rng, &mut posted);
        }
        if hostile && rng.below(16) == 0 {
            hostile_modify(&mut p, &mut rng);
        }
        if hostile && requests && rng.below(8) == 0 {
            let expected = p.eng.query_qp(p.qpn).unwrap().rq_psn;
            let keys = [p.data.rkey, p.guards[0].rkey, p.guards[1].rkey, p.data.rkey ^ 1, 0];
            for _ in 0..1 + rng.below(3) {
                let r = adv.request(expected, &keys);
                rx(&mut p, r);
            }
        }
        for o in p.tx() {
            if trace() {
                eprintln!("{:>12} engine sends {o}", p.now.0);
            }
            let f = o.op().flags();
            if f & op::REQ != 0 {
                let read_len = o.repr.ext.reth.map_or(0, |r| r.len);
                let s = o.psn();
                let n = if f & op::READ != 0 { read_len.div_ceil(mtu).max(1) } else { 1 };
                let top = psn(s + n);
                if adv.max_psn.is_none_or(|m| roce_dp::wire::Psn::new(top).after(roce_dp::wire::Psn::new(m))) {
                    adv.max_psn = Some(top);
                }
                adv.seen.push(Sent { psn: s, op: o.op(), read_len });
                if !hostile && honest_after {
                    for r in adv.honest(*adv.seen.last().unwrap()) {
                        rx(&mut p, r);
                    }
                }
            }
        }
        if hostile {
            for r in adv.hostile() {
                rx(&mut p, r);
            }
            p.assert_guards();
            let st = p.state();
            if !matches!(st, QpState::Rts | QpState::Err) {
                return Err(format!("QP in {st:?}"));
            }
            let d = Duration::from_nanos(rng.below(2 * p.cfg.ack_timeout().as_nanos()));
            p.advance(d);
            continue;
        }
        // After the hostile phase: silence (or honest answers) while time runs on, until every WR has ended.
        if p.eng.cq_len(p.scq) as u64 >= posted {
            break;
        }
        if p.eng.has_pending_tx() {
            continue;
        }
        match p.deadline() {
            Some(_) if p.now.0 < 3_600_000_000_000 => {
                p.fire();
            }
            _ => break,
        }
    }
    p.assert_guards();
    let info = p.eng.query_qp(p.qpn).unwrap();
    let mut c = Vec::new();
    while let Some(x) = p.eng.poll_cq_one(p.scq) {
        c.push(x);
    }
    let ids: Vec<u64> = c.iter().map(|x| x.wr_id).collect();
    let want: Vec<u64> = (0..posted).collect();
    if ids != want {
        return Err(format!(
            "completions {ids:?} of {posted} WRs at {:?} ({info:?}; deadline {:?}; {:?})",
            p.now,
            p.deadline(),
            p.counters()
        ));
    }
    if let Some(x) = c.iter().find(|x| x.status != WcStatus::Success) {
        if info.state != QpState::Err {
            return Err(format!("error completion {x:?} but the QP is {:?}", info.state));
        }
    }
    let mut got_recvs = 0;
    while let Some(x) = p.eng.poll_cq_one(p.rcq) {
        got_recvs += 1;
        if x.status != WcStatus::Success && info.state != QpState::Err {
            return Err(format!("receive completion {x:?} but the QP is {:?}", info.state));
        }
    }
    if got_recvs > recvs {
        return Err(format!("{got_recvs} receive completions for {recvs} receive WRs"));
    }
    let qc = p.counters();
    cov.requests_in += qc.rx_packets + qc.duplicate_requests + qc.out_of_sequence;
    cov.wrs += posted;
    cov.success += c.iter().filter(|x| x.status == WcStatus::Success).count() as u64;
    cov.errors += c.iter().filter(|x| x.status != WcStatus::Success).count() as u64;
    cov.qp_err += u64::from(info.state == QpState::Err);
    cov.rnr += qc.rnr_nak_rcvd;
    cov.bad_responses += qc.bad_responses;
    Ok(())
}

/// The application (a daemon client: its ModifyQp reaches the engine as it is) changes attributes of the running
/// QP, among them the ones that number and segment its packets; refused or not, no WR may be left without an end.
/// RTS -> SQD -> RTS on the way, sometimes. (Never rnr_retry = 7 or timeout = 0: those wait forever by design.)
fn hostile_modify(p: &mut Peer, rng: &mut SimRng) {
    if p.state() != QpState::Rts {
        return;
    }
    let mut a = QpAttr { state: Some(QpState::Rts), ..QpAttr::default() };
    match rng.below(9) {
        0 => a.path_mtu = Some([256, 512, 1024, 2048, 4096][rng.below(5) as usize]),
        1 => a.sq_psn = Some(rng.below(1 << 24) as u32),
        2 => a.rq_psn = Some(rng.below(1 << 24) as u32),
        3 => a.dest_qpn = Some(rng.below(1 << 24) as u32),
        4 => a.timeout = Some(1 + rng.below(12) as u8),
        5 => a.retry_cnt = Some(rng.below(7) as u8),
        6 => a.rnr_retry = Some(rng.below(7) as u8),
        7 => a.max_rd_atomic = Some(1 + rng.below(4) as u8),
        _ => a.access = Some(roce_dp::AccessFlags(rng.below(16) as u32)),
    }
    let via_sqd = rng.below(4) == 0;
    if via_sqd {
        let _ = p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Sqd), ..QpAttr::default() });
    }
    let r = p.eng.modify_qp(p.qpn, &a);
    if via_sqd {
        let _ = p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Rts), ..QpAttr::default() });
    }
    if trace() {
        eprintln!("{:>12} modify {a:?} (via SQD: {via_sqd}): {r:?}", p.now.0);
    }
}

fn trace() -> bool {
    std::env::var_os("ROCE_HOSTILE_TRACE").is_some()
}

fn rx(p: &mut Peer, r: Pkt) {
    if trace() {
        let mut s = String::new();
        let repr = roce_dp::wire::RoceRepr { bth: r.bth, ext: r.ext, ..Default::default() };
        summary(&mut s, &repr, r.payload.len()).unwrap();
        eprintln!("{:>12}     peer sends {s}", p.now.0);
    }
    p.rx(r);
}

#[test]
fn every_wr_ends_whatever_the_peer_answers() {
    let seeds = Seeds::from_env(0x00ad_7e55, 400);
    let mut cov = Cover::default();
    let failures = seeds.run("hostile peer", 8, |seed| run(seed, &mut cov));
    eprintln!("hostile peer: {} runs: {cov:?}", seeds.iters);
    seeded::assert_none(&failures);
    if seeds.iters >= 100 {
        assert!(cov.success > 0 && cov.errors > 0 && cov.qp_err > 0 && cov.rnr > 0 && cov.bad_responses > 0, "{cov:?}");
    }
}
