//! Isolation of the appliance's clients, without DPDK: the daemon is `roce_dp::ctrl::loopback` (the control server
//! and the appliance on one loopback engine), in this process or, when its death is the point, in a child process;
//! clients whose death is the point are child processes too.
//!
//! - A client killed with SIGKILL mid-transfer: the daemon and another client carry on (its transfer completes,
//!   every byte checked), and the dead client's QPs, CQs, MRs and PD are gone from the statistics (what roce-stat
//!   shows) within one second.
//! - A client that writes garbage into its rings and WQEs (random ring indices, huge lengths, another client's lkey
//!   and rkey, addresses outside its regions, an inline length past its slot's inline area, random WQE bytes, a
//!   random CQ head, random bytes over its whole QP region) and names another client's handles: each of its QPs goes to the error state with a clear completion
//!   status, the other client's transfer runs on unaffected, the other client's untouched region keeps every byte,
//!   canary pages beside the garbage client's registered window (in the same memfd the daemon maps) keep theirs, and
//!   the daemon's worker never panics.
//! - A client whose daemon goes away, by shutdown and by SIGKILL of the daemon's process: a clear error from the
//!   library (polling an empty CQ, a control call, reopening), never a hang; a restarted daemon serves new sessions
//!   while the old one keeps reporting the daemon gone.
//!
//! `harness = false`: the binary is its own child (`ROCE_ISO_ROLE`). Run: `cargo test -p roce-dp --test isolation`.

mod own_main;
mod raw_session;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use raw_session::*;
use roce_dp::client::{Device, Error, StatRecord};
use roce_dp::ctrl::abi::{self, RecvWqe, Wqe};
use roce_dp::ctrl::daemon::VENDOR_RING_CORRUPT;
use roce_dp::ctrl::loopback::{wait_cqe, LoopPair, LoopbackConfig, LoopbackDaemon};
use roce_dp::ctrl::proto::{ErrorCode, Request, Response};
use roce_dp::ctrl::shm::{Backing, ShmRegion};
use roce_dp::sim::SimRng;
use roce_dp::{AccessFlags, QpAttr, QpState, SendWr, Sge, WcStatus, WrOpcode};

const ROLE: &str = "ROCE_ISO_ROLE";
const SOCK: &str = "ROCE_ISO_SOCK";
const PAGE: usize = 4096;

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-iso-{}-{tag}.sock", std::process::id()))
}

// ------------------------------------------------------------------------------------------------ child processes

/// A child process, killed and reaped if the test fails before it is done with it.
struct ChildGuard {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl ChildGuard {
    /// Spawns this binary in `role` with the socket `path`; stdin stays a pipe the child watches, so that it exits
    /// if this process dies.
    fn spawn(role: &str, path: &Path) -> ChildGuard {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ROLE, role)
            .env(SOCK, path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let out = BufReader::new(child.stdout.take().unwrap());
        ChildGuard { child, out }
    }

    /// The child's next line (it prints `ready ...` when set up).
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        assert!(!l.is_empty(), "child exited before saying it was ready");
        l.trim_end().to_string()
    }

    fn kill9(&mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Exits this (child) process when the parent's end of stdin closes: no child outlives a failed test.
fn exit_with_parent() {
    std::thread::spawn(|| {
        let mut b = [0u8; 64];
        while std::io::stdin().read(&mut b).is_ok_and(|n| n > 0) {}
        std::process::exit(0);
    });
}

fn child_path() -> PathBuf {
    PathBuf::from(std::env::var_os(SOCK).expect("ROCE_ISO_SOCK"))
}

/// Child role "daemon": a loopback daemon until killed (or the parent goes).
fn child_daemon() {
    let d = LoopbackDaemon::start(LoopbackConfig::new(child_path())).expect("child daemon starts");
    println!("ready {}", std::process::id());
    let mut b = [0u8; 64];
    while std::io::stdin().read(&mut b).is_ok_and(|n| n > 0) {}
    drop(d);
}

/// Child role "writer": WRITEs of 64 KiB between its two QPs, 8 in flight, forever (until SIGKILL).
fn child_writer() {
    exit_with_parent();
    let mut p = LoopPair::open(&child_path(), 1 << 20, 16, 1024).expect("writer session");
    let mut done = 0u64;
    let mut inflight = 0;
    loop {
        while inflight < 8 {
            let wr = SendWr::new(done, WrOpcode::RdmaWrite).remote(p.mr.addr() + (512 << 10), p.mr.rkey());
            p.a.post_send(&wr, &[p.mr.sge(0, 64 << 10)]).unwrap();
            inflight += 1;
        }
        let c = wait_cqe(&mut p.cq, Duration::from_secs(10)).unwrap().expect("writer completion");
        assert_eq!(c.status, WcStatus::Success);
        inflight -= 1;
        done += 1;
        if done == 16 {
            println!("ready {} {}", p.a.qpn(), p.b.qpn());
        }
    }
}

// ------------------------------------------------------------------------------------------------ helpers

/// A client transferring on a thread until told to stop.
struct Busy {
    stop: Arc<AtomicBool>,
    h: std::thread::JoinHandle<Result<u32, String>>,
    qpns: (u32, u32),
}

impl Busy {
    fn start(mut p: LoopPair) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let qpns = (p.a.qpn(), p.b.qpn());
        Busy { stop, qpns, h: std::thread::spawn(move || transfer(&mut p, &s, 3)) }
    }

    fn finish(self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.h.join().expect("transfer thread").unwrap_or_else(|e| panic!("the other client's transfer failed: {e}"))
    }
}

fn stat(recs: &[StatRecord], scope: &str, id: u32, name: &str) -> Option<u64> {
    recs.iter().find(|r| r.scope == scope && r.id == id && r.name == name).map(|r| r.value)
}

fn qps_in_stats(recs: &[StatRecord]) -> Vec<u32> {
    let mut v: Vec<u32> = recs.iter().filter(|r| r.scope == "qp" && r.name == "state").map(|r| r.id).collect();
    v.sort_unstable();
    v
}

// ------------------------------------------------------------------------------------------------ kill -9

fn killed_client_is_reclaimed_within_a_second_and_others_carry_on() {
    let path = sock("kill");
    let mut d = LoopbackDaemon::start(LoopbackConfig::new(&path)).unwrap();
    let busy = Busy::start(LoopPair::open(&path, 256 << 10, 16, 1024).unwrap());
    let watcher = Device::open(&path).unwrap();
    // Sessions that end with nothing to reclaim: five that only ask (as `roce-stat` does) and one that frees its PD
    // itself. `sessions_reclaimed` counted each of them too (session 14: it counts the killed client's alone).
    for _ in 0..5 {
        Device::open(&path).unwrap().stats().unwrap();
    }
    let tidy = Device::open(&path).unwrap();
    drop(tidy.alloc_pd().unwrap());
    drop(tidy);
    let mut child = ChildGuard::spawn("writer", &path);
    let line = child.line();
    let qpns: Vec<u32> = line.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect();
    let before = watcher.stats().unwrap();
    assert_eq!(qps_in_stats(&before), {
        let mut v = vec![busy.qpns.0, busy.qpns.1, qpns[0], qpns[1]];
        v.sort_unstable();
        v
    });
    assert_eq!(stat(&before, "daemon", 0, "qps"), Some(4));
    // The child is mid-transfer: its QP's packet count moves (polled: a loaded machine may not schedule it for a
    // while; 10 s is a hang, not load).
    let tx0 = stat(&before, "qp", qpns[0], "tx_packets").unwrap();
    let waited = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let tx1 = stat(&watcher.stats().unwrap(), "qp", qpns[0], "tx_packets").unwrap();
        if tx1 > tx0 {
            break;
        }
        assert!(waited.elapsed() < Duration::from_secs(10), "the child sent nothing in 10 s ({tx0} -> {tx1} packets)");
    }

    child.kill9();
    let t0 = Instant::now();
    let after = loop {
        let s = watcher.stats().unwrap();
        if !qps_in_stats(&s).iter().any(|q| qpns.contains(q)) && stat(&s, "daemon", 0, "mrs") == Some(1) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(1), "the killed client's objects are still there after 1 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    println!("  reclaimed {:?} after {:?}", qpns, t0.elapsed());
    for (name, want) in [("qps", 2), ("cqs", 1), ("mrs", 1), ("pds", 1), ("sessions_reclaimed", 1)] {
        assert_eq!(stat(&after, "daemon", 0, name), Some(want), "{name}");
    }
    // The other client carries on: more rounds after the kill, every byte checked.
    std::thread::sleep(Duration::from_millis(200));
    let rounds = busy.finish();
    assert!(rounds >= 3, "{rounds} rounds");
    let app = d.shutdown("test over").expect("the worker did not panic");
    assert_eq!(app.counts(), (0, 0, 0, 0));
}

// ------------------------------------------------------------------------------------------------ garbage

/// A hostile act on a fresh pair of connected QPs (x, y) of the garbage client.
type Case = dyn Fn(&mut RawQp, &mut RawQp, &mut SimRng);

fn garbage_client_errors_only_its_own_qps() {
    let path = sock("garbage");
    let mut d = LoopbackDaemon::start(LoopbackConfig::new(&path)).unwrap();
    // The other client: a transfer running throughout, and a region it never uses, whose keys the garbage uses.
    let victim = LoopPair::open(&path, 256 << 10, 16, 1024).unwrap();
    let mut vault = victim.pd.reg_mr(64 << 10, AccessFlags::ALL).unwrap();
    for (i, b) in vault.as_mut_slice().iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(13) ^ 0x5a;
    }
    let vault_copy = vault.as_slice().to_vec();
    let (v_addr, v_lkey, v_rkey) = (vault.addr(), vault.lkey(), vault.rkey());
    let (v_pd, v_cq) = (victim.pd.handle(), victim.cq.handle());
    let busy = Busy::start(victim);

    // The garbage client: a 5-page memfd of canaries with pages 1-2 registered; the daemon maps all five.
    let mut s = Raw::open(&path);
    let Response::Pd { pd } = s.call(&Request::AllocPd, None).0 else { panic!("pd") };
    let mut mem = ShmRegion::create("roce-iso-garbage", 5 * PAGE, Backing::Pages).unwrap();
    mem.as_mut_slice().fill(0xc5);
    let base = mem.as_mut_slice().as_mut_ptr() as u64;
    let win = base + PAGE as u64;
    let q = Request::RegMr { pd, va: win, len: 2 * PAGE as u64, offset: PAGE as u64, access: AccessFlags::ALL.0 };
    let Response::Mr { lkey, rkey } = s.call(&q, Some(mem.fd())).0 else { panic!("mr") };
    let (cq, r, h) = s.region(&Request::CreateCq { depth: 256, channel: None });
    let mut cq = RawCq { id: cq, r, h, head: 0 };

    // Another client's handles are not found (and change nothing).
    for q in [
        Request::DestroyQp { qpn: busy.qpns.0 },
        Request::QueryQp { qpn: busy.qpns.1 },
        Request::DeregMr { lkey: v_lkey },
        Request::DeallocPd { pd: v_pd },
        Request::DestroyCq { cq: v_cq },
    ] {
        let r = s.call(&q, None).0;
        assert!(matches!(r, Response::Error { code: ErrorCode::NotFound, .. }), "{q:?}: {r:?}");
    }

    let own = move |off: u64, len: u32| Sge { addr: win + off, len, lkey };
    let mut rng = SimRng::new(7);
    let mut errored = Vec::new();
    // (what, WQE on x's send queue) -> x must complete it with an error and go to the error state.
    let cases: Vec<(&str, Box<Case>)> = vec![
        (
            "another client's lkey",
            Box::new(move |x, _, _| {
                x.post(wqe(WrOpcode::RdmaWrite, Sge { addr: v_addr, len: 4096, lkey: v_lkey }, (win, rkey)))
            }),
        ),
        (
            "another client's rkey",
            Box::new(move |x, _, _| x.post(wqe(WrOpcode::RdmaWrite, own(0, 4096), (v_addr, v_rkey)))),
        ),
        (
            "READ from another client's region",
            Box::new(move |x, _, _| x.post(wqe(WrOpcode::RdmaRead, own(0, 4096), (v_addr, v_rkey)))),
        ),
        (
            "local address below the region",
            Box::new(move |x, _, _| x.post(wqe(WrOpcode::RdmaWrite, Sge { addr: base, len: 64, lkey }, (win, rkey)))),
        ),
        (
            "READ into the page after the region",
            Box::new(move |x, _, _| {
                x.post(wqe(WrOpcode::RdmaRead, Sge { addr: win + 2 * PAGE as u64, len: 4096, lkey }, (win, rkey)))
            }),
        ),
        (
            "remote address past the region",
            Box::new(move |x, _, _| x.post(wqe(WrOpcode::RdmaWrite, own(0, 4096), (win + PAGE as u64 + 8, rkey)))),
        ),
        ("huge length", Box::new(move |x, _, _| x.post(wqe(WrOpcode::RdmaWrite, own(0, u32::MAX), (win, rkey))))),
        (
            "atomic outside the region",
            Box::new(move |x, _, _| x.post(wqe(WrOpcode::AtomicFetchAdd, own(0, 8), (win + 2 * PAGE as u64, rkey)))),
        ),
        (
            "num_sge 200",
            Box::new(move |x, _, _| {
                let mut w = wqe(WrOpcode::Send, own(0, 64), (0, 0));
                w.num_sge = 200;
                x.post(w)
            }),
        ),
        (
            "inline length 65 past its 64-byte inline area",
            Box::new(|x, _, _| {
                let mut wr = SendWr::new(0xbad, WrOpcode::Send);
                wr.inline = true;
                assert_eq!(x.h.sq_inline.per_slot, 64, "max_inline 64 asked, 64 granted");
                x.post(Wqe::encode(&wr, &[], 65))
            }),
        ),
        (
            "inline length 2^32 - 1 on a WRITE",
            Box::new(move |x, _, _| {
                let mut wr = SendWr::new(0xbad, WrOpcode::RdmaWrite).remote(win, rkey);
                wr.inline = true;
                x.post(Wqe::encode(&wr, &[], u32::MAX))
            }),
        ),
        (
            "random WQE bytes",
            Box::new(|x, _, rng| {
                let mut w = Wqe::default();
                let raw: [u64; 8] = core::array::from_fn(|_| rng.next_u64());
                w.wr_id = raw[0];
                w.opcode = raw[1] as u8;
                w.flags = (raw[1] >> 8) as u8 | 0x80;
                w.num_sge = (raw[1] >> 16) as u8;
                w.remote_addr = raw[2];
                w.rkey = raw[3] as u32;
                w.inline_len = (raw[3] >> 32) as u32;
                w.sge0 = abi::Sge { addr: raw[4], len: raw[5] as u32, lkey: (raw[5] >> 32) as u32 };
                x.post(w)
            }),
        ),
        (
            "random send-queue tail",
            Box::new(|x, _, rng| {
                let t = rng.next_u64() as u32 | 0x4000_0000;
                x.r.write(x.h.sq.offset as usize + 128, t).unwrap();
            }),
        ),
        (
            "random receive-queue tail",
            Box::new(|x, _, rng| {
                let t = rng.next_u64() as u32 | 0x4000_0000;
                x.r.write(x.h.rq.offset as usize + 128, t).unwrap();
            }),
        ),
        (
            "a receive 100 bytes before the region's end with a huge length, then a 1 KiB SEND into it",
            Box::new(move |x, y, _| {
                let at = win + 2 * PAGE as u64 - 100;
                y.post_recv(RecvWqe::encode(1, &[roce_dp::Sge { addr: at, len: 0x7fff_ffff, lkey }]));
                x.post(wqe(WrOpcode::Send, own(0, 1024), (0, 0)));
            }),
        ),
    ];
    for (what, f) in &cases {
        let (mut x, mut y) = raw_pair(&mut s, pd, cq.id);
        f(&mut x, &mut y, &mut rng);
        let c = cq.next_of(x.qpn);
        let status = c.decode().map(|c| c.status);
        assert!(status.is_ok_and(|st| st != WcStatus::Success), "{what}: {c:?}");
        let until = Instant::now() + Duration::from_secs(5);
        while s.state(x.qpn) != QpState::Err {
            assert!(Instant::now() < until, "{what}: QP {:#x} not in the error state", x.qpn);
            std::thread::sleep(Duration::from_millis(2));
        }
        if what.contains("tail") {
            assert_eq!((c.status, c.vendor_err), (WcStatus::LocQpOpErr.code() as u8, VENDOR_RING_CORRUPT), "{what}");
        }
        if what.starts_with("inline length") {
            // WqeError::InlineTooLong: the worker copies at most the slot's inline area and refuses the rest.
            assert_eq!((c.status, c.vendor_err), (WcStatus::LocQpOpErr.code() as u8, 5), "{what}");
        }
        if matches!(*what, "num_sge 200" | "random WQE bytes") {
            assert_eq!(c.status, WcStatus::LocQpOpErr.code() as u8, "{what}");
            assert!((1..0x100).contains(&c.vendor_err), "{what}: vendor_err {:#x} names the reason", c.vendor_err);
        }
        println!("  {what}: QP {:#x} -> ERR, {:?} vendor_err {:#x}", x.qpn, status.unwrap(), c.vendor_err);
        errored.push(x.qpn);
    }

    // A random CQ head: the daemon drops what it cannot deliver (the QPs using that CQ see nothing more).
    let (c2, r, h) = s.region(&Request::CreateCq { depth: 16, channel: None });
    let mut cq2 = RawCq { id: c2, r, h, head: 0 };
    let (mut x, _y) = raw_pair(&mut s, pd, cq2.id);
    cq2.r.write(cq2.h.sq.offset as usize, 0x8000_0000u32 | rng.next_u64() as u32).unwrap();
    x.post(wqe(WrOpcode::RdmaWrite, own(0, 64), (win + 64, rkey)));
    let until = Instant::now() + Duration::from_secs(5);
    while stat(&busy_stats(&path), "daemon", 0, "cqes_dropped").unwrap_or(0) == 0 {
        assert!(Instant::now() < until, "the completion for a corrupt CQ ring was not dropped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A stream of structured-random WQEs (honest indices, hostile fields: keys of both clients, any address and
    // length, random opcode, flags and SGE count) on fresh pairs, completions drained meanwhile.
    let keys = [lkey, rkey, v_lkey, v_rkey];
    for _ in 0..4 {
        let (mut x, _y) = raw_pair(&mut s, pd, cq.id);
        for i in 0..500u32 {
            while x.tail.wrapping_sub(x.r.read::<u32>(x.h.sq.offset as usize).unwrap()) >= x.h.sq.capacity {
                while cq.poll(Duration::ZERO).is_some() {}
                std::thread::yield_now();
            }
            let pick = |rng: &mut SimRng| keys[rng.below(4) as usize] ^ (rng.below(2) as u32 * rng.next_u64() as u32);
            let addr = [win, v_addr, base, rng.next_u64()][rng.below(4) as usize] + rng.below(3 * PAGE as u64);
            let sge = Sge {
                addr,
                len: [8, 4096, u32::MAX, rng.next_u64() as u32][rng.below(4) as usize],
                lkey: pick(&mut rng),
            };
            let op = [WrOpcode::RdmaWrite, WrOpcode::RdmaRead, WrOpcode::Send, WrOpcode::AtomicCmpSwp]
                [rng.below(4) as usize];
            let mut w = Wqe::encode(&SendWr::new(u64::from(i), op).remote(addr ^ 0x40, pick(&mut rng)), &[sge], 0);
            match rng.below(4) {
                0 => w.opcode = rng.next_u64() as u8,
                1 => w.num_sge = rng.next_u64() as u8,
                2 => w.flags = rng.next_u64() as u8,
                _ => {}
            }
            x.post(w);
        }
        while cq.poll(Duration::from_millis(50)).is_some() {}
        assert_eq!(s.state(x.qpn), QpState::Err, "QP {:#x} after 500 random WQEs", x.qpn);
        errored.push(x.qpn);
    }
    // Random bytes over whole QP regions (header, rings, side tables), indices included, several times.
    for _ in 0..20 {
        let (mut x, _y) = raw_pair(&mut s, pd, cq.id);
        for off in (0..x.r.len()).step_by(8) {
            x.r.write(off, rng.next_u64()).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(200));

    // Nothing else moved: the other client transferred throughout, its untouched region is intact, the canary
    // pages beside the garbage client's window are intact, and the worker is alive.
    let rounds = busy.finish();
    assert!(rounds >= 3);
    assert!(vault.as_slice() == &vault_copy[..], "the other client's region changed");
    let m = mem.as_mut_slice();
    for (page, range) in [(0, 0..PAGE), (3, 3 * PAGE..5 * PAGE)] {
        assert!(m[range].iter().all(|b| *b == 0xc5), "canary page {page} beside the garbage client's window changed");
    }
    let recs = busy_stats(&path);
    for q in &errored {
        assert_eq!(stat(&recs, "qp", *q, "state"), Some(QpState::Err as u64), "QP {q:#x}");
    }
    assert!(stat(&recs, "daemon", 0, "wqes_refused").unwrap() >= 4);
    drop(s);
    drop(vault);
    let app = d.shutdown("test over").expect("the worker did not panic");
    assert_eq!(app.counts(), (0, 0, 0, 0), "everything reclaimed");
}

/// Session 14: a send ring whose indices a hostile client corrupted completed (LOC_QP_OP_ERR, `vendor_err`
/// 0x101) before the flush of the WRs it had posted before it: `[corrupt, WRITE flushed]`. Each queue's
/// completions come in post order, for a hostile client too: its QP now goes to error first, so the WRs before
/// the corruption are flushed, then the corruption completes.
fn corrupt_send_ring_completes_after_the_flush_of_the_wrs_before_it() {
    let path = sock("corrupt-order");
    let mut d = LoopbackDaemon::start(LoopbackConfig::new(&path)).unwrap();
    let mut s = Raw::open(&path);
    let Response::Pd { pd } = s.call(&Request::AllocPd, None).0 else { panic!("pd") };
    let mut mem = ShmRegion::create("roce-iso-corrupt-order", PAGE, Backing::Pages).unwrap();
    let win = mem.as_mut_slice().as_mut_ptr() as u64;
    let q = Request::RegMr { pd, va: win, len: PAGE as u64, offset: 0, access: AccessFlags::ALL.0 };
    let Response::Mr { lkey, rkey } = s.call(&q, Some(mem.fd())).0 else { panic!("mr") };
    let (cq, r, h) = s.region(&Request::CreateCq { depth: 16, channel: None });
    let mut cq = RawCq { id: cq, r, h, head: 0 };
    let (mut x, _y) = raw_pair(&mut s, pd, cq.id);
    // A WRITE held in the engine (SQD starts no new WR), then the ring's tail thrown far ahead.
    let sqd = QpAttr { state: Some(QpState::Sqd), ..QpAttr::default() };
    assert_eq!(s.modify(x.qpn, sqd, None), Response::Ok);
    x.post(wqe(WrOpcode::RdmaWrite, Sge { addr: win, len: 64, lkey }, (win + 1024, rkey)));
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match s.call(&Request::QueryQp { qpn: x.qpn }, None).0 {
            Response::QpInfo(i) if i.sq_outstanding == 1 => break,
            Response::QpInfo(_) => assert!(Instant::now() < until, "the WRITE never reached the engine"),
            r => panic!("query: {r:?}"),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    x.r.write(x.h.sq.offset as usize + 128, x.tail.wrapping_add(0x4000_0000)).unwrap();
    let got: Vec<_> = (0..2).map(|_| cq.next_of(x.qpn)).map(|c| (c.wr_id, c.status, c.vendor_err)).collect();
    let (flush, loc) = (WcStatus::WrFlushErr.code() as u8, WcStatus::LocQpOpErr.code() as u8);
    assert_eq!(got, [(0xbad, flush, 0), (0, loc, VENDOR_RING_CORRUPT)]);
    assert_eq!(s.state(x.qpn), QpState::Err);
    drop(s);
    d.shutdown("test over").expect("the worker did not panic");
}

fn busy_stats(path: &Path) -> Vec<StatRecord> {
    Device::open(path).unwrap().stats().unwrap()
}

// ------------------------------------------------------------------------------------------------ daemon gone

fn expect_gone(r: Result<Option<roce_dp::Cqe>, Error>, what: &str) -> Error {
    match r {
        Err(e @ Error::DaemonGone { .. }) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n') && msg.contains("is gone"), "{what}: {msg}");
            e
        }
        other => panic!("{what}: expected DaemonGone, got {other:?}"),
    }
}

fn daemon_shutdown_is_a_clear_error_not_a_hang() {
    let path = sock("shut");
    let mut d = LoopbackDaemon::start(LoopbackConfig::new(&path)).unwrap();
    let mut p = LoopPair::open(&path, 64 << 10, 16, 1024).unwrap();
    // A receive outstanding at shutdown is flushed into the CQ ring before the session is told.
    p.b.post_recv(77, &[p.mr.sge(0, 1024)]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let poller = std::thread::spawn(move || {
        let mut got = Vec::new();
        let r = loop {
            match wait_cqe(&mut p.cq, Duration::from_secs(10)) {
                Ok(Some(c)) => got.push(c),
                r => break r,
            }
        };
        (r, got, p)
    });
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    d.shutdown("maintenance");
    let (r, got, p) = poller.join().unwrap();
    let e = expect_gone(r, "poll after shutdown");
    assert!(e.to_string().contains("maintenance"), "{e}");
    println!("  poll: {e} (after {:?})", t0.elapsed());
    assert!(got.iter().any(|c| c.wr_id == 77 && c.status == WcStatus::WrFlushErr), "flushed receive: {got:?}");
    let e = p.a.query().unwrap_err();
    assert!(matches!(e, Error::DaemonGone { .. }), "{e}");
    assert!(matches!(Device::open(&path), Err(Error::DaemonAbsent { .. })));
}

fn killed_daemon_is_a_clear_error_and_a_restart_serves_anew() {
    let path = sock("dkill");
    let mut daemon = ChildGuard::spawn("daemon", &path);
    assert!(daemon.line().starts_with("ready"));
    let mut p = LoopPair::open(&path, 64 << 10, 16, 1024).unwrap();
    let wr = SendWr::new(1, WrOpcode::RdmaWrite).remote(p.mr.addr() + 4096, p.mr.rkey());
    p.a.post_send(&wr, &[p.mr.sge(0, 4096)]).unwrap();
    assert_eq!(wait_cqe(&mut p.cq, Duration::from_secs(10)).unwrap().unwrap().status, WcStatus::Success);
    p.b.post_recv(5, &[p.mr.sge(0, 64)]).unwrap();

    daemon.kill9();
    let t0 = Instant::now();
    let e = expect_gone(wait_cqe(&mut p.cq, Duration::from_secs(10)), "poll after the daemon was killed");
    assert!(t0.elapsed() < Duration::from_secs(5), "noticed after {:?}", t0.elapsed());
    println!("  poll: {e} (after {:?})", t0.elapsed());
    let e = p.a.to_rts(1).unwrap_err();
    assert!(matches!(e, Error::DaemonGone { .. }), "{e}");
    // The socket file is left behind by the killed daemon: nobody answers on it.
    let e = Device::open(&path).unwrap_err();
    assert!(matches!(e, Error::DaemonAbsent { .. }), "{e}");

    // A new daemon on the same path serves new sessions; the old session still says its daemon is gone.
    let mut again = ChildGuard::spawn("daemon", &path);
    assert!(again.line().starts_with("ready"));
    let mut fresh = LoopPair::open(&path, 64 << 10, 16, 1024).unwrap();
    let wr = SendWr::new(2, WrOpcode::RdmaWrite).remote(fresh.mr.addr() + 4096, fresh.mr.rkey());
    fresh.a.post_send(&wr, &[fresh.mr.sge(0, 4096)]).unwrap();
    assert_eq!(wait_cqe(&mut fresh.cq, Duration::from_secs(10)).unwrap().unwrap().status, WcStatus::Success);
    assert!(matches!(p.dev.stats(), Err(Error::DaemonGone { .. })));
    drop(fresh);
    drop(p);
    again.kill9();
    let _ = std::fs::remove_file(&path);
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("daemon") => return child_daemon(),
        Ok("writer") => return child_writer(),
        Ok(other) => panic!("unknown {ROLE} {other}"),
        Err(_) => {}
    }
    let tests: [(&str, fn()); 5] = [
        (
            "killed_client_is_reclaimed_within_a_second_and_others_carry_on",
            killed_client_is_reclaimed_within_a_second_and_others_carry_on,
        ),
        ("garbage_client_errors_only_its_own_qps", garbage_client_errors_only_its_own_qps),
        (
            "corrupt_send_ring_completes_after_the_flush_of_the_wrs_before_it",
            corrupt_send_ring_completes_after_the_flush_of_the_wrs_before_it,
        ),
        ("daemon_shutdown_is_a_clear_error_not_a_hang", daemon_shutdown_is_a_clear_error_not_a_hang),
        (
            "killed_daemon_is_a_clear_error_and_a_restart_serves_anew",
            killed_daemon_is_a_clear_error_and_a_restart_serves_anew,
        ),
    ];
    own_main::run_tests(&tests);
}
