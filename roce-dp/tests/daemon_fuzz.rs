//! A seeded hostile client against the loopback daemon (`roce_dp::ctrl::loopback`, no DPDK; one to three workers by
//! seed), mixing the control socket and the shared-memory rings in one random sequence, while another client holds a
//! region it never uses:
//!
//! - control requests with hostile values: handles of its own, of the other client, made up; RegMr with any
//!   va/len/offset/access and with the memfd, no descriptor, /dev/null, a socket; CreateCq and CreateQp with
//!   depths, SGE counts and inline sizes from 0 to 2^32 - 1 and any CQs; ModifyQp with any state and attributes
//!   (GIDs too); DestroyCq/DeregMr/DeallocPd of objects in use; Stats and StatsFrom anywhere; Hello again;
//! - its rings: structured WQEs (its own window, the other client's keys and addresses, any length, opcode, flags,
//!   SGE count, inline length), receive WQEs, random ring tails, random bytes over slots and side tables, a random
//!   CQ head, its CQs drained or left to fill.
//!
//! The rule: every request gets its answer within `CALL_LIMIT` (or, after Hello again, the session is closed
//! cleanly), the daemon's worker never panics, the other client's region keeps every byte and its transfer
//! afterwards is correct, the canary pages beside the hostile client's window keep theirs, and once both
//! sessions are gone the daemon holds nothing.
//!
//! Seeded: `ROCE_HOSTILE_SEED`, `ROCE_HOSTILE_ITERS` (runs, default 6), `ROCE_FUZZ_STEPS` (steps per run, default
//! 2000), `ROCE_HOSTILE_SOAK=1` (100x the runs), `ROCE_FUZZ_VERBOSE=1` (what the requests got, per run).

#![cfg(target_os = "linux")]

mod raw_session;
mod seeded;

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use raw_session::*;
use roce_dp::ctrl::abi::{self, RecvWqe, Wqe};
use roce_dp::ctrl::loopback::{LoopPair, LoopbackConfig, LoopbackDaemon};
use roce_dp::ctrl::proto::{ModifyQp, Request, Response};
use roce_dp::ctrl::shm::{Backing, ShmRegion};
use roce_dp::sim::SimRng;
use roce_dp::{AccessFlags, QpAttr, QpState, SendWr, Sge, WrOpcode};
use seeded::Seeds;

const PAGE: usize = 4096;
const CANARY: u8 = 0xc5;

struct Hostile {
    rng: SimRng,
    s: Raw,
    pds: Vec<u32>,
    keys: Vec<u32>,
    cqs: Vec<RawCq>,
    qps: Vec<RawQp>,
    /// The other client's handles and keys, and its region's address.
    victim: Vec<u32>,
    v_addr: u64,
    base: u64,
    win: u64,
    lkey: u32,
    rkey: u32,
    mem: ShmRegion,
    null: std::fs::File,
    sock: UnixStream,
    log: Vec<String>,
    path: PathBuf,
}

impl Hostile {
    fn pick(&mut self, own: &[u32]) -> u32 {
        let r = &mut self.rng;
        match r.below(6) {
            0 if !self.victim.is_empty() => self.victim[r.below(self.victim.len() as u64) as usize],
            1 => r.next_u64() as u32,
            2 => 0,
            _ if !own.is_empty() => own[r.below(own.len() as u64) as usize],
            _ => r.below(0x300) as u32,
        }
    }

    fn size(&mut self) -> u32 {
        let r = &mut self.rng;
        [0, 1, 2, 3, 16, 64, 1000, 4096, 4097, 1 << 20, u32::MAX, r.next_u64() as u32][r.below(12) as usize]
    }

    fn qpns(&self) -> Vec<u32> {
        self.qps.iter().map(|q| q.qpn).collect()
    }

    fn cq_ids(&self) -> Vec<u32> {
        self.cqs.iter().map(|c| c.id).collect()
    }

    /// One request with hostile values; its answer must come.
    fn control(&mut self) {
        let pds = self.pds.clone();
        let qpns = self.qpns();
        let cqs = self.cq_ids();
        let keys = self.keys.clone();
        let k = self.rng.below(16);
        let q = match k {
            0 => Request::AllocPd,
            1 => Request::DeallocPd { pd: self.pick(&pds) },
            2 | 3 => {
                let r = &mut self.rng;
                let va = [self.win, self.base, 0, u64::MAX - 4095, r.next_u64()][r.below(5) as usize];
                let len = [PAGE as u64, 2 * PAGE as u64, 5 * PAGE as u64, 0, u64::MAX, 1 << 40][r.below(6) as usize];
                let offset = [PAGE as u64, 0, 4 * PAGE as u64, 5 * PAGE as u64, u64::MAX, 3][r.below(6) as usize];
                let access = if r.below(2) == 0 { AccessFlags::ALL.0 } else { r.next_u64() as u32 };
                Request::RegMr { pd: self.pick(&pds), va, len, offset, access }
            }
            4 => Request::DeregMr { lkey: self.pick(&keys) },
            5 => {
                let depth = self.size();
                let channel = if self.rng.below(4) == 0 { Some(self.rng.below(4) as u32) } else { None };
                Request::CreateCq { depth, channel }
            }
            6 => Request::DestroyCq { cq: self.pick(&cqs) },
            7 if !pds.is_empty() && !cqs.is_empty() => Request::CreateQp {
                pd: pds[0],
                send_cq: cqs[self.rng.below(cqs.len() as u64) as usize],
                recv_cq: cqs[self.rng.below(cqs.len() as u64) as usize],
                sq_depth: 1 << self.rng.below(7),
                rq_depth: 1 << self.rng.below(7),
                max_send_sge: 1 + self.rng.below(4) as u8,
                max_recv_sge: 1 + self.rng.below(4) as u8,
                max_inline: [0, 64, 256][self.rng.below(3) as usize],
            },
            7 | 8 => Request::CreateQp {
                pd: self.pick(&pds),
                send_cq: self.pick(&cqs),
                recv_cq: self.pick(&cqs),
                sq_depth: self.size(),
                rq_depth: self.size(),
                max_send_sge: self.size() as u8,
                max_recv_sge: self.size() as u8,
                max_inline: self.size(),
            },
            9 | 10 => {
                let qpn = self.pick(&qpns);
                let m = self.modify_attrs(&qpns);
                Request::ModifyQp { qpn, m }
            }
            11 => Request::QueryQp { qpn: self.pick(&qpns) },
            12 => Request::DestroyQp { qpn: self.pick(&qpns) },
            13 => Request::Stats,
            14 => Request::StatsFrom { first: self.size() },
            _ => {
                if self.rng.below(50) == 0 {
                    Request::Hello { abi: self.rng.below(3) as u32 + abi::ABI_VERSION - 1 }
                } else {
                    Request::CreateCompChannel
                }
            }
        };
        let fd_pick = self.rng.below(6);
        let fd: Option<BorrowedFd<'_>> = match (&q, fd_pick) {
            (Request::RegMr { .. }, 0) => None,
            (Request::RegMr { .. }, 1) => Some(self.null.as_fd()),
            (Request::RegMr { .. }, 2) => Some(self.sock.as_fd()),
            (Request::RegMr { .. }, _) => Some(self.mem.fd()),
            (_, 0) => Some(self.null.as_fd()),
            _ => None,
        };
        self.log.push(format!("{q:?} fd {}", fd.is_some()));
        if matches!(q, Request::Hello { .. }) {
            // A second Hello: an answer, or the session closed; then a new session (its objects are reclaimed).
            self.s.seq += 1;
            let fds: Vec<_> = fd.into_iter().collect();
            let sent = self.s.conn.send_request(self.s.seq, &q, &fds).is_ok();
            let until = std::time::Instant::now() + CALL_LIMIT;
            let r = if sent { self.s.conn.recv_response_until(Some(until)) } else { Ok(None) };
            if let Ok(None) = r {
                if sent {
                    panic!("{q:?}: no answer and no close in {CALL_LIMIT:?}");
                }
            }
            self.reopen();
            return;
        }
        let (r, mut fds) = self.s.call(&q, fd);
        if let Some(l) = self.log.last_mut() {
            let r = format!("{r:?}");
            *l = format!("{} -> {}", l.split(' ').next().unwrap_or(""), &r[..r.len().min(40)]);
        }
        match (&q, r) {
            (_, Response::Error { msg, .. }) => {
                assert!(!msg.is_empty() && !msg.contains('\n'), "{q:?}: error {msg:?} is not one line");
            }
            (Request::AllocPd, Response::Pd { pd }) => self.pds.push(pd),
            (Request::RegMr { .. }, Response::Mr { lkey, rkey }) => self.keys.extend([lkey, rkey]),
            (Request::CreateCq { .. }, Response::Cq { cq }) => {
                let r = ShmRegion::map(fds.pop().expect("CQ region fd")).unwrap();
                let h = r.read(0).unwrap();
                self.cqs.push(RawCq { id: cq, r, h, head: 0 });
            }
            (Request::CreateQp { .. }, Response::Qp { qpn }) => {
                let r = ShmRegion::map(fds.pop().expect("QP region fd")).unwrap();
                let h = r.read(0).unwrap();
                self.qps.push(RawQp { qpn, r, h, tail: 0, rq_tail: 0 });
            }
            (Request::DestroyQp { qpn }, Response::QpDestroyed { .. }) => self.qps.retain(|x| x.qpn != *qpn),
            (Request::DestroyCq { cq }, Response::Ok) => self.cqs.retain(|x| x.id != *cq),
            (_, Response::Shutdown { .. } | Response::Closed { .. }) => panic!("{q:?}: the daemon closed the session"),
            _ => {}
        }
    }

    fn modify_attrs(&mut self, qpns: &[u32]) -> ModifyQp {
        let states =
            [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err];
        let dest = self.pick(qpns);
        let r = &mut self.rng;
        let mut a = QpAttr { state: Some(states[r.below(7) as usize]), ..QpAttr::default() };
        let opt = |r: &mut SimRng| r.below(3) == 0;
        if opt(r) {
            a.access = Some(AccessFlags(r.next_u64() as u32));
        }
        if opt(r) {
            a.path_mtu = Some([256, 1024, 4096, 0, 100, u32::MAX][r.below(6) as usize]);
        }
        if opt(r) {
            a.dest_qpn = Some(dest);
        }
        if opt(r) {
            a.rq_psn = Some(r.next_u64() as u32);
        }
        if opt(r) {
            a.sq_psn = Some(r.next_u64() as u32);
        }
        if opt(r) {
            a.max_dest_rd_atomic = Some(r.next_u64() as u8);
        }
        if opt(r) {
            a.max_rd_atomic = Some(r.next_u64() as u8);
        }
        if opt(r) {
            a.min_rnr_timer = Some(r.next_u64() as u8);
        }
        if opt(r) {
            a.timeout = Some(r.next_u64() as u8);
        }
        if opt(r) {
            a.retry_cnt = Some(r.next_u64() as u8);
        }
        if opt(r) {
            a.rnr_retry = Some(r.next_u64() as u8);
        }
        if opt(r) {
            a.dscp = Some(r.next_u64() as u8);
        }
        if opt(r) {
            a.ttl = Some(r.next_u64() as u8);
        }
        let gid = match r.below(4) {
            0 => None,
            1 => Some(GID),
            2 => Some([0xff; 16]),
            _ => Some(core::array::from_fn(|_| r.next_u64() as u8)),
        };
        let mac = if r.below(4) == 0 { Some(core::array::from_fn(|_| r.next_u64() as u8)) } else { None };
        ModifyQp { attr: a, gid, mac }
    }

    /// Something written into a QP's or CQ's shared memory.
    fn ring(&mut self) {
        if self.qps.is_empty() {
            return;
        }
        let i = self.rng.below(self.qps.len() as u64) as usize;
        let keys = [self.lkey, self.rkey, self.victim.last().copied().unwrap_or(0), self.rng.next_u64() as u32];
        let (win, v_addr, base) = (self.win, self.v_addr, self.base);
        let r = &mut self.rng;
        let addr = [win, win + PAGE as u64, v_addr, base, r.next_u64()][r.below(5) as usize] + r.below(2 * PAGE as u64);
        let len = [8, 64, 4096, 8192, u32::MAX, r.next_u64() as u32][r.below(6) as usize];
        let sge = Sge { addr, len, lkey: keys[r.below(4) as usize] };
        let ops = [
            WrOpcode::Send,
            WrOpcode::SendWithImm,
            WrOpcode::RdmaWrite,
            WrOpcode::RdmaRead,
            WrOpcode::AtomicCmpSwp,
            WrOpcode::AtomicFetchAdd,
        ];
        let op = ops[r.below(6) as usize];
        let remote = addr ^ (r.below(4) * 8);
        let mut wr = SendWr::new(r.next_u64(), op).remote(remote, keys[r.below(4) as usize]);
        wr.inline = r.below(6) == 0;
        let inline_len = if wr.inline { [0, 8, 64, 65, 256, u32::MAX][r.below(6) as usize] } else { 0 };
        let mut w = Wqe::encode(&wr, &[sge], inline_len);
        match r.below(8) {
            0 => w.opcode = r.next_u64() as u8,
            1 => w.num_sge = r.next_u64() as u8,
            2 => w.flags = r.next_u64() as u8,
            _ => {}
        }
        let what = r.below(12);
        let q = &mut self.qps[i];
        match what {
            0..=5 => {
                // An honest index (the tail at most `capacity` ahead of the daemon's head), unless the ring is full.
                let head: u32 = q.r.read(q.h.sq.offset as usize).unwrap();
                if q.tail.wrapping_sub(head) < q.h.sq.capacity {
                    q.post(w);
                }
            }
            6 | 7 => {
                let head: u32 = q.r.read(q.h.rq.offset as usize).unwrap();
                if q.rq_tail.wrapping_sub(head) < q.h.rq.capacity {
                    q.post_recv(RecvWqe::encode(r.next_u64(), &[roce_dp::Sge { addr, len, lkey: sge.lkey }]));
                }
            }
            8 => {
                let t = r.next_u64() as u32;
                let at = if r.below(2) == 0 { q.h.sq.offset } else { q.h.rq.offset } as usize + 128;
                q.r.write(at, t).unwrap();
            }
            9 => {
                // Random bytes somewhere in the QP's region (header, rings, side tables).
                let off = (r.below(q.r.len() as u64) as usize) & !7;
                q.r.write(off, r.next_u64()).unwrap();
            }
            _ => {
                if let Some(c) = self.cqs.last_mut() {
                    c.r.write(c.h.sq.offset as usize, r.next_u64() as u32).unwrap();
                }
            }
        }
        self.log.push(format!("ring op {what} on QP {:#x}", self.qps[i].qpn));
    }

    /// Two new QPs of this session connected to each other (as far as the daemon lets them: a step that fails
    /// leaves them where they are).
    fn pair(&mut self) {
        let (Some(&pd), Some(cq)) = (self.pds.first(), self.cqs.first().map(|c| c.id)) else { return };
        let q = pair_qp(pd, cq);
        let mut made = Vec::new();
        for _ in 0..2 {
            let (r, mut fds) = self.s.call(&q, None);
            let Response::Qp { qpn } = r else { return };
            let r = ShmRegion::map(fds.pop().expect("QP region fd")).unwrap();
            let h = r.read(0).unwrap();
            made.push(qpn);
            self.qps.push(RawQp { qpn, r, h, tail: 0, rq_tail: 0 });
        }
        for (a, b) in [(made[0], made[1]), (made[1], made[0])] {
            for (attr, gid) in connect_steps(b) {
                if self.s.modify(a, attr, gid) != Response::Ok {
                    break;
                }
            }
        }
        self.log.push(format!("pair {made:x?}"));
    }

    fn drain(&mut self) {
        for c in &mut self.cqs {
            for _ in 0..64 {
                if c.poll(Duration::ZERO).is_none() {
                    break;
                }
            }
        }
    }

    /// A fresh session after the old one was closed (the daemon reclaims what it held).
    fn reopen(&mut self) {
        self.s = Raw::open(&self.path);
        self.qps.clear();
        self.cqs.clear();
        self.keys.clear();
        let Response::Pd { pd } = self.s.call(&Request::AllocPd, None).0 else { panic!("pd") };
        self.pds = vec![pd];
        self.register();
    }

    fn register(&mut self) {
        let pd = self.pds[0];
        let q =
            Request::RegMr { pd, va: self.win, len: 2 * PAGE as u64, offset: PAGE as u64, access: AccessFlags::ALL.0 };
        let Response::Mr { lkey, rkey } = self.s.call(&q, Some(self.mem.fd())).0 else { panic!("mr") };
        (self.lkey, self.rkey) = (lkey, rkey);
        self.keys = vec![lkey, rkey];
    }
}

fn run(seed: u64, steps: u64) -> Result<(), String> {
    let path = std::env::temp_dir().join(format!("roce-dp-dfuzz-{}-{seed:x}.sock", std::process::id()));
    // One worker, or several (QPs spread over engines; frames for another worker's QP cross over).
    let cfg = LoopbackConfig { workers: 1 + (seed % 3) as usize, ..LoopbackConfig::new(&path) };
    let mut d = LoopbackDaemon::start(cfg).map_err(|e| e.to_string())?;
    let mut victim = LoopPair::open(&path, 256 << 10, 16, 1024).map_err(|e| e.to_string())?;
    let mut vault = victim.pd.reg_mr(64 << 10, AccessFlags::ALL).unwrap();
    for (i, b) in vault.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13) ^ 0x5a;
    }
    let vault_copy = vault.as_slice().to_vec();
    let victim_ids = vec![
        vault.lkey(),
        vault.rkey(),
        victim.mr.lkey(),
        victim.pd.handle(),
        victim.cq.handle(),
        victim.a.qpn(),
        victim.b.qpn(),
    ];

    let mut mem = ShmRegion::create("roce-dfuzz", 5 * PAGE, Backing::Pages).unwrap();
    mem.as_mut_slice().fill(CANARY);
    let base = mem.as_mut_slice().as_mut_ptr() as u64;
    let mut h = Hostile {
        rng: SimRng::new(seed),
        s: Raw::open(&path),
        pds: Vec::new(),
        keys: Vec::new(),
        cqs: Vec::new(),
        qps: Vec::new(),
        victim: victim_ids,
        v_addr: vault.addr(),
        base,
        win: base + PAGE as u64,
        lkey: 0,
        rkey: 0,
        mem,
        null: std::fs::File::open("/dev/null").unwrap(),
        sock: UnixStream::pair().unwrap().0,
        log: Vec::new(),
        path: path.clone(),
    };
    let Response::Pd { pd } = h.s.call(&Request::AllocPd, None).0 else { panic!("pd") };
    h.pds.push(pd);
    h.register();
    // A connected pair to start from, so the rings carry traffic.
    {
        let (c, r, hd) = h.s.region(&Request::CreateCq { depth: 256, channel: None });
        h.cqs.push(RawCq { id: c, r, h: hd, head: 0 });
        let (x, y) = raw_pair(&mut h.s, pd, c);
        h.qps.extend([x, y]);
    }
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for i in 0..steps {
            match h.rng.below(40) {
                0..=13 => h.control(),
                14..=31 => h.ring(),
                32 | 33 => h.pair(),
                34..=37 => h.drain(),
                _ => std::thread::sleep(Duration::from_micros(200)),
            }
            if i % 64 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }));
    if let Err(p) = res {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        let tail: Vec<&String> = h.log.iter().rev().take(8).collect();
        let _ = d.shutdown("test failed");
        return Err(format!("{}; last actions (newest first): {tail:?}", msg.unwrap_or_default()));
    }
    std::thread::sleep(Duration::from_millis(50));
    if std::env::var_os("ROCE_FUZZ_VERBOSE").is_some() {
        let mut hist = std::collections::BTreeMap::new();
        for l in &h.log {
            let key: String = l.chars().take_while(|c| *c != '(' && *c != '{' && *c != ':').collect();
            *hist.entry(key).or_insert(0u32) += 1;
        }
        eprintln!("seed {seed}: {} QPs, {} CQs live; {hist:#?}", h.qps.len(), h.cqs.len());
    }
    let m = h.mem.as_mut_slice();
    for (page, range) in [(0, 0..PAGE), (3, 3 * PAGE..5 * PAGE)] {
        if let Some(i) = m[range.clone()].iter().position(|b| *b != CANARY) {
            return Err(format!("canary page {page} beside the hostile window changed at byte {i}"));
        }
    }
    drop(h);
    let rounds = transfer(&mut victim, &AtomicBool::new(true), 3)
        .map_err(|e| format!("the other client's transfer after the hostile one: {e}"))?;
    if rounds < 3 || vault.as_slice() != &vault_copy[..] {
        return Err("the other client's region changed".into());
    }
    drop(vault);
    drop(victim);
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while d.sessions() > 0 {
        if std::time::Instant::now() > until {
            return Err(format!("{} sessions still open 10 s after both clients left", d.sessions()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let app = d.shutdown("test over").ok_or("the daemon's worker panicked")?;
    if app.counts() != (0, 0, 0, 0) {
        return Err(format!("objects left after both sessions closed: {:?}", app.counts()));
    }
    Ok(())
}

#[test]
fn hostile_client_mixing_control_and_rings() {
    let seeds = Seeds::from_env(0xd0_f022, 6);
    let steps = std::env::var("ROCE_FUZZ_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let failures = seeds.run("daemon_fuzz", 5, |s| run(s, steps));
    seeded::assert_none(&failures);
}
