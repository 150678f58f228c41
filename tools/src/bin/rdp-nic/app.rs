//! The verbs workload of rdp-nic, on an `Engine` only (no DPDK): QP setup, the requester (posts and checks
//! completions) and the responder (posts receives, checks what landed), every byte verified.
//!
//! Memory: each QP has `slots` = depth message slots on each side; message `k` uses slot `k % slots`.
//! * SEND: the responder posts one receive per slot; on its completion it verifies the slot, then reposts it.
//! * WRITE: RDMA WRITE with immediate (imm = message number): the immediate consumes a receive, so the responder
//!   knows when message `k` landed and verifies the slot before the requester can reuse it (the requester reuses
//!   a slot only after the ACK, which leaves after the responder's poll that saw the last packet; the responder
//!   checks completions right after that poll, before it handles any further frame).
//! * READ: the responder's slots hold a fixed pattern; the requester verifies each READ on completion.
//! * Atomics: alternating FETCH_ADD (k + 1) and CMP_SWP (v -> v + 1000) on one counter per QP; the requester
//!   verifies every returned value, the responder the final counter.

use roce_dp::{
    AccessFlags, CqId, Cqe, Engine, MrKeys, PeerAddr, QpAttr, QpCaps, QpState, SendWr, Sge, WcStatus, WrOpcode,
};

/// The operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Op {
    Send,
    Write,
    Read,
    Atomic,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
            Op::Atomic => "atomic",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Op> {
        [Op::Send, Op::Write, Op::Read, Op::Atomic].into_iter().find(|o| o.name() == s)
    }
}

/// What both sides agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    pub(crate) op: Op,
    pub(crate) size: u32,
    pub(crate) iters: u64,
    pub(crate) qps: u32,
    pub(crate) mtu: u32,
    pub(crate) depth: u32,
    /// Local ACK timeout exponent (4.096 µs * 2^t).
    pub(crate) qp_timeout: u8,
    /// Generate and check message contents (off only for benchmarks: --no-verify).
    pub(crate) verify: bool,
}

impl Params {
    pub(crate) fn msg_size(&self) -> u64 {
        if self.op == Op::Atomic {
            8
        } else {
            u64::from(self.size)
        }
    }

    fn slots(&self) -> u64 {
        u64::from(self.depth.max(1)).min(self.iters.max(1))
    }

    /// One line for the out-of-band HELLO.
    pub(crate) fn to_line(self) -> String {
        format!(
            "HELLO {} {} {} {} {} {} {}",
            self.op.name(),
            self.size,
            self.iters,
            self.qps,
            self.mtu,
            self.depth,
            u8::from(self.verify)
        )
    }

    pub(crate) fn from_line(l: &str) -> Option<Params> {
        let mut it = l.split_whitespace();
        (it.next()? == "HELLO").then_some(())?;
        let op = Op::parse(it.next()?)?;
        let mut n = || it.next()?.parse::<u64>().ok();
        let (size, iters, qps, mtu, depth, verify) = (n()?, n()?, n()?, n()?, n()?, n()?);
        Some(Params {
            op,
            size: u32::try_from(size).ok()?,
            iters,
            qps: u32::try_from(qps).ok()?,
            mtu: u32::try_from(mtu).ok()?,
            depth: u32::try_from(depth).ok()?,
            qp_timeout: 12,
            verify: verify != 0,
        })
    }
}

/// Fill `buf` with the pattern of message `k` on QP `q`: one 64-bit word per 8 bytes, distinct for every (q, k,
/// word), so a misplaced, stale or partial message never matches.
pub(crate) fn fill(q: u32, k: u64, buf: &mut [u8]) {
    let seed = mix(u64::from(q) << 40 ^ k);
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let v = seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        c.copy_from_slice(&v.to_le_bytes()[..c.len()]);
    }
}

/// The first byte of `buf` that differs from `fill(q, k, ..)`, if any.
pub(crate) fn verify(q: u32, k: u64, buf: &[u8]) -> Option<usize> {
    let seed = mix(u64::from(q) << 40 ^ k);
    for (i, c) in buf.chunks(8).enumerate() {
        let v = (seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes();
        if c != &v[..c.len()] {
            let j = c.iter().zip(v).position(|(a, b)| *a != b).unwrap_or(0);
            return Some(i * 8 + j);
        }
    }
    None
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One local QP: its number, CQ, region and first PSN.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Local {
    pub(crate) qpn: u32,
    pub(crate) cq: CqId,
    pub(crate) mr: MrKeys,
    pub(crate) va: u64,
    pub(crate) psn: u32,
}

/// What the peer tells us about its QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Remote {
    pub(crate) qpn: u32,
    pub(crate) psn: u32,
    pub(crate) rkey: u32,
    pub(crate) va: u64,
}

impl Remote {
    pub(crate) fn of(l: &Local) -> Remote {
        Remote { qpn: l.qpn, psn: l.psn, rkey: l.mr.rkey, va: l.va }
    }

    pub(crate) fn to_line(self) -> String {
        format!("QP {} {} {} {}", self.qpn, self.psn, self.rkey, self.va)
    }

    pub(crate) fn from_line(l: &str) -> Option<Remote> {
        let mut it = l.split_whitespace();
        (it.next()? == "QP").then_some(())?;
        let mut n = || it.next()?.parse::<u64>().ok();
        Some(Remote {
            qpn: u32::try_from(n()?).ok()?,
            psn: u32::try_from(n()?).ok()?,
            rkey: u32::try_from(n()?).ok()?,
            va: n()?,
        })
    }
}

/// Create `p.qps` QPs with their CQs and regions (RESET -> INIT). `node` (0 requester, 1 responder) picks the VA.
pub(crate) fn create(e: &mut Engine, p: &Params, node: u64) -> Result<Vec<Local>, String> {
    let region = (p.slots() * p.msg_size()).max(8) as usize;
    let mut out = Vec::new();
    for q in 0..p.qps {
        let pd = e.alloc_pd();
        let cq = e.create_cq(p.depth * 2 + 16).map_err(|e| format!("create_cq: {e}"))?;
        let va = ((node + 1) << 40) + (u64::from(q) << 32);
        let mr = e.reg_mr(pd, va, region, AccessFlags::ALL).map_err(|e| format!("reg_mr: {e}"))?;
        let caps = QpCaps { max_send_wr: p.depth.max(1), max_recv_wr: p.depth.max(1), ..QpCaps::default() };
        let qpn = e.create_qp(pd, cq, cq, caps).map_err(|e| format!("create_qp: {e}"))?;
        let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
        e.modify_qp(qpn, &init).map_err(|e| format!("modify_qp INIT: {e}"))?;
        let psn = (0xff_fff0 - q * 7 + node as u32 * 0x1000) & 0xff_ffff; // near the 2^24 wrap
        out.push(Local { qpn, cq, mr, va, psn });
    }
    Ok(out)
}

/// INIT -> RTR -> RTS towards `remote` at `peer`.
pub(crate) fn connect(e: &mut Engine, l: &Local, r: &Remote, p: &Params, peer: PeerAddr) -> Result<(), String> {
    let c = roce_dp_tools::RcConnect {
        qpn: l.qpn,
        sq_psn: l.psn,
        dest_qpn: r.qpn,
        rq_psn: r.psn,
        path_mtu: p.mtu,
        timeout: p.qp_timeout,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
    };
    roce_dp_tools::connect_rc(e, &c, peer)
}

const NO_CQE: Cqe = Cqe::EMPTY;

struct ReqQp {
    l: Local,
    r: Remote,
    posted: u64,
    done: u64,
    /// Atomics: the counter value before the next WR to complete.
    counter: u64,
    /// Atomics: the counter value before the next WR to post (WRs execute in order).
    post_counter: u64,
    /// The slot of the next WR to post (`posted % slots`, kept by wrapping: no division per WR).
    slot: u64,
}

/// The requester side: posts up to depth WRs per QP and checks every completion.
pub(crate) struct Requester {
    p: Params,
    qps: Vec<ReqQp>,
    pub(crate) verified_bytes: u64,
    pub(crate) failure: Option<String>,
    /// Completions checked, over every QP.
    done: u64,
    cqes: [Cqe; 32],
    /// Ping-pong runs (one QP, depth 1): each WR's time from post to completion, in nanoseconds.
    pub(crate) rtts: Vec<u64>,
    pingpong: bool,
    posted_at: Option<std::time::Instant>,
}

impl Requester {
    pub(crate) fn new(p: Params, locals: &[Local], remotes: &[Remote]) -> Self {
        let qps = locals
            .iter()
            .zip(remotes)
            .map(|(l, r)| ReqQp { l: *l, r: *r, posted: 0, done: 0, counter: 0, post_counter: 0, slot: 0 })
            .collect();
        let pingpong = p.qps == 1 && p.depth == 1;
        let rtts = Vec::with_capacity(if pingpong { p.iters.min(1 << 24) as usize } else { 0 });
        Self { p, qps, verified_bytes: 0, failure: None, done: 0, cqes: [NO_CQE; 32], rtts, pingpong, posted_at: None }
    }

    pub(crate) fn completed(&self) -> u64 {
        self.done
    }

    pub(crate) fn finished(&self) -> bool {
        self.failure.is_some() || self.done == self.p.iters * self.qps.len() as u64
    }

    /// Post what the window allows and check completions; true if anything happened. A pass that finds no
    /// completion and a full window (every pass of a ping-pong while its WR is in flight) is one CQ poll and one
    /// compare per QP: the completion handling and the posting are out of line.
    pub(crate) fn step(&mut self, e: &mut Engine) -> bool {
        let mut busy = false;
        let depth = u64::from(self.p.depth);
        for qi in 0..self.qps.len() {
            let cq = self.qps[qi].l.cq;
            loop {
                let n = e.poll_cq(cq, &mut self.cqes);
                if n == 0 {
                    break;
                }
                busy = true;
                self.completions(e, qi, n);
            }
            let q = &self.qps[qi];
            if q.posted < self.p.iters && q.posted - q.done < depth && self.failure.is_none() {
                self.post_window(e, qi);
                busy = true;
            }
        }
        busy
    }

    /// Checks the `n` completions in `self.cqes` of QP `qi`.
    #[inline(never)]
    fn completions(&mut self, e: &Engine, qi: usize, n: usize) {
        if let Some(t) = self.posted_at.take() {
            self.rtts.push(t.elapsed().as_nanos() as u64);
        }
        let q = &mut self.qps[qi];
        for c in &self.cqes[..n] {
            match check(&self.p, e, qi as u32, q, c, &mut self.verified_bytes) {
                Ok(()) => self.done += 1,
                Err(err) => {
                    self.failure.get_or_insert(err);
                }
            }
        }
    }

    /// Posts WRs on QP `qi` until its window is full (or a post fails).
    #[inline(never)]
    fn post_window(&mut self, e: &mut Engine, qi: usize) {
        let size = self.p.msg_size();
        let slots = self.p.slots();
        let q = &mut self.qps[qi];
        let qi = qi as u32;
        while q.posted < self.p.iters && q.posted - q.done < u64::from(self.p.depth) && self.failure.is_none() {
            let k = q.posted;
            let slot = q.slot;
            let local = q.l.va + slot * size;
            let (opcode, remote) = match self.p.op {
                Op::Send => (WrOpcode::Send, 0),
                Op::Write => (WrOpcode::RdmaWriteWithImm, q.r.va + slot * size),
                Op::Read => (WrOpcode::RdmaRead, q.r.va + slot * size),
                Op::Atomic => {
                    (if k.is_multiple_of(2) { WrOpcode::AtomicFetchAdd } else { WrOpcode::AtomicCmpSwp }, q.r.va)
                }
            };
            if matches!(self.p.op, Op::Send | Op::Write) && self.p.verify {
                let mem = e.mr_bytes_mut(q.l.mr.lkey).expect("own MR");
                let base = (slot * size) as usize;
                fill(qi, k, &mut mem[base..base + size as usize]);
            }
            let mut wr = SendWr::new(k, opcode).remote(remote, q.r.rkey);
            wr.imm = k as u32;
            if self.p.op == Op::Atomic {
                // FETCH_ADD adds k + 1 to the value v before it; CMP_SWP swaps v for v + 1000. WRs execute in
                // order, so v is known when posting.
                if opcode == WrOpcode::AtomicFetchAdd {
                    wr.compare_add = k + 1;
                } else {
                    wr.compare_add = q.post_counter;
                    wr.swap = q.post_counter + 1000;
                }
                q.post_counter = next_counter(q.post_counter, k);
            }
            let sge = Sge { addr: local, len: size as u32, lkey: q.l.mr.lkey };
            if self.pingpong {
                self.posted_at = Some(std::time::Instant::now());
            }
            if let Err(err) = e.post_send(q.l.qpn, &wr, &[sge]) {
                self.failure = Some(format!("post_send QP {:#x} WR {k}: {err}", q.l.qpn));
                break;
            }
            q.posted += 1;
            q.slot = if slot + 1 == slots { 0 } else { slot + 1 };
        }
    }
}

fn check(p: &Params, e: &Engine, qi: u32, q: &mut ReqQp, c: &Cqe, verified: &mut u64) -> Result<(), String> {
    if c.status != WcStatus::Success {
        return Err(format!("QP {:#x} WR {} completed with {}", q.l.qpn, c.wr_id, c.status.as_str()));
    }
    if c.wr_id != q.done {
        return Err(format!("QP {:#x}: completion for WR {} but expected WR {}", q.l.qpn, c.wr_id, q.done));
    }
    let k = c.wr_id;
    let size = p.msg_size();
    // The slot's bytes only where they are checked (a WRITE or SEND completion has nothing to read back).
    let slot_bytes = || {
        let base = ((k % p.slots()) * size) as usize;
        let mem = e.mr_bytes(q.l.mr.lkey).expect("own MR");
        &mem[base..base + size as usize]
    };
    match p.op {
        Op::Read if p.verify => {
            if let Some(i) = verify(qi, k % p.slots(), slot_bytes()) {
                return Err(format!("QP {:#x} READ {k}: byte {i} differs", q.l.qpn));
            }
            *verified += size;
        }
        Op::Atomic => {
            let got = u64::from_le_bytes(slot_bytes()[..8].try_into().expect("8"));
            if got != q.counter {
                return Err(format!("QP {:#x} atomic {k}: returned {got}, expected {}", q.l.qpn, q.counter));
            }
            q.counter = next_counter(q.counter, k);
            *verified += 8;
        }
        Op::Read | Op::Send | Op::Write => {}
    }
    q.done += 1;
    Ok(())
}

/// The atomic counter after WR `k` when it held `v` before.
pub(crate) fn next_counter(v: u64, k: u64) -> u64 {
    if k.is_multiple_of(2) {
        v + k + 1
    } else {
        v + 1000
    }
}

/// The responder side: posts receives (SEND, WRITE with immediate), verifies each message when it completes,
/// reposts; for READ it fills its slots first; for atomics it checks the counter at the end.
pub(crate) struct Responder {
    p: Params,
    /// Per QP: the QP, its completed receives and the slot of the next one (`done % slots`, kept by wrapping).
    qps: Vec<(Local, u64, u64)>,
    pub(crate) verified_bytes: u64,
    pub(crate) failure: Option<String>,
    cqes: [Cqe; 32],
}

impl Responder {
    pub(crate) fn new(p: Params, locals: &[Local], e: &mut Engine) -> Result<Self, String> {
        let r = Self {
            p,
            qps: locals.iter().map(|l| (*l, 0, 0)).collect(),
            verified_bytes: 0,
            failure: None,
            cqes: [NO_CQE; 32],
        };
        let size = p.msg_size();
        let slots = p.slots();
        for (qi, (l, _, _)) in r.qps.iter().enumerate() {
            match p.op {
                Op::Read => {
                    let mem = e.mr_bytes_mut(l.mr.lkey).expect("own MR");
                    for s in 0..slots {
                        fill(qi as u32, s, &mut mem[(s * size) as usize..((s + 1) * size) as usize]);
                    }
                }
                Op::Send | Op::Write => {
                    for k in 0..slots {
                        post_recv(e, &p, l, k, k)?;
                    }
                }
                Op::Atomic => {}
            }
        }
        Ok(r)
    }

    /// Whether the responder has seen everything it can check by itself (READ/atomic: nothing to wait for).
    pub(crate) fn finished(&self) -> bool {
        self.failure.is_some()
            || !matches!(self.p.op, Op::Send | Op::Write)
            || self.qps.iter().all(|(_, done, _)| *done == self.p.iters)
    }

    pub(crate) fn step(&mut self, e: &mut Engine) -> bool {
        let mut busy = false;
        let size = self.p.msg_size();
        let slots = self.p.slots();
        for (qi, (l, done, slot)) in self.qps.iter_mut().enumerate() {
            loop {
                let n = e.poll_cq(l.cq, &mut self.cqes);
                if n == 0 {
                    break;
                }
                busy = true;
                for c in &self.cqes[..n] {
                    let k = *done;
                    let res = (|| {
                        if c.status != WcStatus::Success {
                            return Err(format!(
                                "QP {:#x} receive {} completed with {}",
                                l.qpn,
                                c.wr_id,
                                c.status.as_str()
                            ));
                        }
                        let want_imm = (self.p.op == Op::Write).then_some(k as u32);
                        if c.wr_id != k || u64::from(c.byte_len) != size && self.p.op == Op::Send || c.imm != want_imm {
                            return Err(format!(
                                "QP {:#x}: receive completion wr_id {} len {} imm {:?} (expected {k}, {size}, {want_imm:?})",
                                l.qpn, c.wr_id, c.byte_len, c.imm
                            ));
                        }
                        if !self.p.verify {
                            return Ok(());
                        }
                        let mem = e.mr_bytes(l.mr.lkey).expect("own MR");
                        let base = (*slot * size) as usize;
                        if let Some(i) = verify(qi as u32, k, &mem[base..base + size as usize]) {
                            return Err(format!("QP {:#x} {} {k}: byte {i} differs", l.qpn, self.p.op.name()));
                        }
                        Ok(())
                    })();
                    match res {
                        Ok(()) => {
                            if self.p.verify {
                                self.verified_bytes += size;
                            }
                            *done += 1;
                            // Message k + slots lands in k's slot.
                            let next = k + slots;
                            if next < self.p.iters {
                                if let Err(err) = post_recv(e, &self.p, l, next, *slot) {
                                    self.failure.get_or_insert(err);
                                }
                            }
                            *slot = if *slot + 1 == slots { 0 } else { *slot + 1 };
                        }
                        Err(err) => {
                            self.failure.get_or_insert(err);
                        }
                    }
                }
            }
        }
        busy
    }

    /// Atomics: every counter holds the value the whole sequence produces.
    pub(crate) fn final_check(&mut self, e: &Engine) {
        if self.p.op != Op::Atomic || self.failure.is_some() {
            return;
        }
        let want = (0..self.p.iters).fold(0, next_counter);
        for (l, _, _) in &self.qps {
            let mem = e.mr_bytes(l.mr.lkey).expect("own MR");
            let v = u64::from_le_bytes(mem[..8].try_into().expect("8"));
            if v != want {
                self.failure = Some(format!("QP {:#x}: atomic counter {v}, expected {want}", l.qpn));
                return;
            }
            self.verified_bytes += 8;
        }
    }
}

/// Mean, median and 10th percentile in microseconds of round-trip times in nanoseconds, the first `warmup` left
/// out; `None` if nothing is left. The 10th percentile follows the host's fast phase on this VM, where the median
/// of a run can fall in either of its 2-3x apart phases.
pub(crate) fn rtt_summary(ns: &[u64], warmup: usize) -> Option<(f64, f64, f64)> {
    let mut v = ns.get(warmup..).filter(|v| !v.is_empty())?.to_vec();
    let avg = v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0;
    v.sort_unstable();
    Some((avg, v[v.len() / 2] as f64 / 1000.0, v[v.len() / 10] as f64 / 1000.0))
}

/// Post receive `k` (its wr_id) into slot `slot` (`k % slots`, which callers keep without a division).
fn post_recv(e: &mut Engine, p: &Params, l: &Local, k: u64, slot: u64) -> Result<(), String> {
    let size = p.msg_size();
    let sge = Sge { addr: l.va + slot * size, len: size as u32, lkey: l.mr.lkey };
    e.post_recv(l.qpn, k, &[sge]).map_err(|err| format!("post_recv QP {:#x}: {err}", l.qpn))
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_dp::sim::{LinkConfig, Sim};

    fn run(p: Params, loss_ppm: u32) -> (Requester, Responder) {
        let links = [LinkConfig { loss_ppm, ..LinkConfig::default() }; 2];
        let mut sim = Sim::new(roce_dp::EngineConfig::default(), links, 7);
        let a = create(&mut sim.nodes[0], &p, 0).unwrap();
        let b = create(&mut sim.nodes[1], &p, 1).unwrap();
        for (l, r) in a.iter().zip(&b) {
            connect(&mut sim.nodes[0], l, &Remote::of(r), &p, Sim::peer_of(1)).unwrap();
            connect(&mut sim.nodes[1], r, &Remote::of(l), &p, Sim::peer_of(0)).unwrap();
        }
        let remotes: Vec<Remote> = b.iter().map(Remote::of).collect();
        let mut req = Requester::new(p, &a, &remotes);
        let mut resp = Responder::new(p, &b, &mut sim.nodes[1]).unwrap();
        for _ in 0..5_000_000 {
            req.step(&mut sim.nodes[0]);
            sim.kick(0);
            sim.process();
            resp.step(&mut sim.nodes[1]);
            if req.finished() && resp.finished() {
                break;
            }
            sim.advance();
        }
        resp.final_check(&sim.nodes[1]);
        (req, resp)
    }

    #[test]
    fn every_op_completes_and_verifies_in_the_simulator() {
        for op in [Op::Send, Op::Write, Op::Read, Op::Atomic] {
            for loss in [0, 20_000] {
                let p = Params { op, size: 3000, iters: 40, qps: 2, mtu: 1024, depth: 8, qp_timeout: 12, verify: true };
                let (req, resp) = run(p, loss);
                assert_eq!(req.failure, None, "{op:?} loss {loss}");
                assert_eq!(resp.failure, None, "{op:?} loss {loss}");
                assert_eq!(req.completed(), 80, "{op:?}");
                let want = if op == Op::Atomic { 8 * 82 } else { 3000 * 80 };
                assert_eq!(req.verified_bytes + resp.verified_bytes, want, "{op:?}");
            }
        }
    }

    #[test]
    fn rtt_summary_skips_the_warm_up() {
        assert_eq!(rtt_summary(&[9000, 1000, 3000, 2000], 1), Some((2.0, 2.0, 1.0)));
        assert_eq!(rtt_summary(&[5000, 1000, 3000], 0), Some((3.0, 3.0, 1.0)));
        let v: Vec<u64> = (1..=20).rev().map(|k| k * 1000).collect();
        assert_eq!(rtt_summary(&v, 0), Some((10.5, 11.0, 3.0)));
        assert_eq!(rtt_summary(&[1000], 1), None);
        assert_eq!(rtt_summary(&[], 0), None);
    }

    #[test]
    fn pattern_detects_every_byte() {
        let mut b = vec![0u8; 37];
        fill(1, 2, &mut b);
        assert_eq!(verify(1, 2, &b), None);
        assert_eq!(verify(1, 3, &b), Some(0));
        assert_eq!(verify(2, 2, &b), Some(0));
        for i in 0..b.len() {
            b[i] ^= 0x40;
            assert_eq!(verify(1, 2, &b), Some(i));
            b[i] ^= 0x40;
        }
    }

    #[test]
    fn oob_lines_round_trip() {
        let p = Params { op: Op::Read, size: 64, iters: 9, qps: 3, mtu: 4096, depth: 16, qp_timeout: 12, verify: true };
        assert_eq!(Params::from_line(&p.to_line()), Some(p));
        let r = Remote { qpn: 0x11, psn: 0xff_fff0, rkey: 0x1234, va: 1 << 40 };
        assert_eq!(Remote::from_line(&r.to_line()), Some(r));
        assert_eq!(Params::from_line("HELLO bogus 1 2 3 4 5"), None);
    }
}
