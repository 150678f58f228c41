//! A control session spoken frame by frame, for clients that misbehave (tests/isolation.rs, tests/daemon_fuzz.rs):
//! the client maps its ring regions itself and writes what it likes; and the honest transfer that checks another
//! client is unaffected.

#![allow(dead_code, unreachable_pub)]

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use roce_dp::ctrl::abi::{self, RecvWqe, RegionHeader, Wqe, ABI_VERSION};
use roce_dp::ctrl::loopback::{wait_cqe, LoopPair, IPV4};
use roce_dp::ctrl::proto::{Conn, ModifyQp, Request, Response};
use roce_dp::ctrl::shm::ShmRegion;
use roce_dp::{AccessFlags, QpAttr, QpState, SendWr, Sge, WcStatus, WrOpcode};

/// How long a control call may wait for its answer before the test fails (a daemon that never answers is a hang).
pub const CALL_LIMIT: Duration = Duration::from_secs(30);

/// Rounds of WRITEs of a fresh pattern (first quarter of the buffer into the second, 8 x 16 KiB in flight), every
/// byte checked, until `stop` is set (and at least `min` rounds). Returns the rounds done.
pub fn transfer(p: &mut LoopPair, stop: &AtomicBool, min: u32) -> Result<u32, String> {
    const CHUNK: usize = 16 << 10;
    const N: usize = 8;
    let dst = N * CHUNK;
    let mut round = 0u32;
    while round < min || !stop.load(Ordering::Relaxed) {
        let data: Vec<u8> =
            (0..N * CHUNK).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(round) as u8).collect();
        p.mr.as_mut_slice()[..N * CHUNK].copy_from_slice(&data);
        for k in 0..N {
            let wr =
                SendWr::new(k as u64, WrOpcode::RdmaWrite).remote(p.mr.addr() + (dst + k * CHUNK) as u64, p.mr.rkey());
            p.a.post_send(&wr, &[p.mr.sge(k * CHUNK, CHUNK as u32)]).map_err(|e| e.to_string())?;
        }
        for _ in 0..N {
            let c = wait_cqe(&mut p.cq, Duration::from_secs(10)).map_err(|e| e.to_string())?;
            let c = c.ok_or(format!("round {round}: no completion in 10 s"))?;
            if c.status != WcStatus::Success {
                return Err(format!("round {round}: {c:?}"));
            }
        }
        if p.mr.as_slice()[dst..dst + N * CHUNK] != data[..] {
            return Err(format!("round {round}: the written bytes differ"));
        }
        round += 1;
    }
    Ok(round)
}

/// A session spoken frame by frame: the garbage client maps its ring regions itself and writes what it likes.
pub struct Raw {
    pub conn: Conn,
    pub seq: u32,
}

impl Raw {
    pub fn open(path: &Path) -> Raw {
        let mut r = Raw { conn: Conn::new(UnixStream::connect(path).unwrap()), seq: 0 };
        assert!(matches!(r.call(&Request::Hello { abi: ABI_VERSION }, None).0, Response::Hello(_)));
        r
    }

    pub fn call(&mut self, q: &Request, fd: Option<std::os::fd::BorrowedFd<'_>>) -> (Response, Vec<OwnedFd>) {
        self.seq += 1;
        let fds: Vec<_> = fd.into_iter().collect();
        self.conn.send_request(self.seq, q, &fds).expect("send");
        let f = self.conn.recv_response_until(Some(Instant::now() + CALL_LIMIT)).expect("the daemon answers");
        let f = f.unwrap_or_else(|| panic!("{q:?}: no answer in {CALL_LIMIT:?}"));
        assert_eq!(f.seq, self.seq);
        (f.msg, f.fds)
    }

    pub fn region(&mut self, q: &Request) -> (u32, ShmRegion, RegionHeader) {
        let (r, mut fds) = self.call(q, None);
        let id = match r {
            Response::Cq { cq } => cq,
            Response::Qp { qpn } => qpn,
            r => panic!("{q:?}: {r:?}"),
        };
        let region = ShmRegion::map(fds.pop().expect("region fd")).unwrap();
        let h: RegionHeader = region.read(0).unwrap();
        (id, region, h)
    }

    pub fn modify(&mut self, qpn: u32, attr: QpAttr, gid: Option<[u8; 16]>) -> Response {
        self.call(&Request::ModifyQp { qpn, m: ModifyQp { attr, gid, mac: None } }, None).0
    }

    pub fn state(&mut self, qpn: u32) -> QpState {
        match self.call(&Request::QueryQp { qpn }, None).0 {
            Response::QpInfo(i) => i.state,
            r => panic!("query {qpn:#x}: {r:?}"),
        }
    }
}

/// A QP's ring region as its (hostile) producer sees it.
pub struct RawQp {
    pub qpn: u32,
    pub r: ShmRegion,
    pub h: RegionHeader,
    pub tail: u32,
    pub rq_tail: u32,
}

impl RawQp {
    pub fn slot(&self, ring: abi::RingDesc, index: u32) -> usize {
        ring.offset as usize + 256 + (index & (ring.capacity - 1)) as usize * ring.entry_size as usize
    }

    pub fn post(&mut self, w: Wqe) {
        self.r.write(self.slot(self.h.sq, self.tail), w).unwrap();
        self.tail = self.tail.wrapping_add(1);
        self.r.write(self.h.sq.offset as usize + 128, self.tail).unwrap();
    }

    pub fn post_recv(&mut self, w: RecvWqe) {
        self.r.write(self.slot(self.h.rq, self.rq_tail), w).unwrap();
        self.rq_tail = self.rq_tail.wrapping_add(1);
        self.r.write(self.h.rq.offset as usize + 128, self.rq_tail).unwrap();
    }
}

/// A CQ's ring region as its consumer sees it.
pub struct RawCq {
    pub id: u32,
    pub r: ShmRegion,
    pub h: RegionHeader,
    pub head: u32,
}

impl RawCq {
    pub fn poll(&mut self, timeout: Duration) -> Option<abi::Cqe> {
        let until = Instant::now() + timeout;
        loop {
            let tail: u32 = self.r.read(self.h.sq.offset as usize + 128).unwrap();
            if tail != self.head {
                let at = self.h.sq.offset as usize + 256 + (self.head & (self.h.sq.capacity - 1)) as usize * 32;
                let c: abi::Cqe = self.r.read(at).unwrap();
                self.head = self.head.wrapping_add(1);
                self.r.write(self.h.sq.offset as usize, self.head).unwrap();
                return Some(c);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::yield_now();
        }
    }

    /// The next completion of `qpn` (others are skipped).
    pub fn next_of(&mut self, qpn: u32) -> abi::Cqe {
        loop {
            let c = self.poll(Duration::from_secs(5)).unwrap_or_else(|| panic!("no completion for QP {qpn:#x} in 5 s"));
            if c.qpn == qpn {
                return c;
            }
        }
    }
}

pub const GID: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, IPV4[0], IPV4[1], IPV4[2], IPV4[3]];

/// The CreateQp of [`raw_pair`]: 16 entries each way, 2 SGEs, 64 inline bytes.
pub fn pair_qp(pd: u32, cq: u32) -> Request {
    Request::CreateQp {
        pd,
        send_cq: cq,
        recv_cq: cq,
        sq_depth: 16,
        rq_depth: 16,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline: 64,
    }
}

/// The modifies that take a QP to RTS connected to QP `dest` of the same loopback daemon (with the GID each
/// needs).
pub fn connect_steps(dest: u32) -> [(QpAttr, Option<[u8; 16]>); 3] {
    let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
    let rtr = QpAttr {
        state: Some(QpState::Rtr),
        path_mtu: Some(1024),
        dest_qpn: Some(dest),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(16),
        min_rnr_timer: Some(1),
        ..QpAttr::default()
    };
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(0),
        timeout: Some(10),
        retry_cnt: Some(2),
        rnr_retry: Some(1),
        max_rd_atomic: Some(16),
        ..QpAttr::default()
    };
    [(init, None), (rtr, Some(GID)), (rts, None)]
}

/// Two QPs of the raw session on `cq`, connected to each other through the loopback.
pub fn raw_pair(s: &mut Raw, pd: u32, cq: u32) -> (RawQp, RawQp) {
    let q = pair_qp(pd, cq);
    let mk = |s: &mut Raw| {
        let (qpn, r, h) = s.region(&q);
        RawQp { qpn, r, h, tail: 0, rq_tail: 0 }
    };
    let (x, y) = (mk(s), mk(s));
    for (a, b) in [(x.qpn, y.qpn), (y.qpn, x.qpn)] {
        for (attr, gid) in connect_steps(b) {
            assert_eq!(s.modify(a, attr, gid), Response::Ok);
        }
    }
    (x, y)
}

pub fn wqe(op: WrOpcode, sge: Sge, remote: (u64, u32)) -> Wqe {
    Wqe::encode(&SendWr::new(0xbad, op).remote(remote.0, remote.1), &[sge], 0)
}
