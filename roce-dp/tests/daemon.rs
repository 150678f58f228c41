//! The appliance without DPDK: a `Server` on a Unix socket and an `Appliance` on one engine whose frames loop back
//! into itself (both QPs on one soft NIC, as `roce-dpd` on a loopback port), driven by a worker thread; two client
//! sessions through the client library do SEND, WRITE, READ and both atomics with every byte checked, and the
//! isolation, error and shutdown paths are checked.

#![cfg(target_os = "linux")]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roce_dp::client::{Cq, Device, Error, ErrorCode, Mr, Qp, QpInit, Remote, StatRecord};
use roce_dp::ctrl::daemon::{job_channel, Appliance, Job, JobSender, Server, ServerConfig};
use roce_dp::ctrl::loopback::{LoopbackConfig, LoopbackDaemon};
use roce_dp::ctrl::proto::DeviceInfo;
use roce_dp::ctrl::shm::Backing;
use roce_dp::engine::QPN_STRIDE;
use roce_dp::neigh::Neighbours;
use roce_dp::wire::MacAddr;
use roce_dp::{AccessFlags, Cqe, Engine, EngineConfig, LocalIp, QpState, SendWr, WcOpcode, WcStatus, WrOpcode};

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const IP: [u8; 4] = [10, 0, 0, 1];

struct Daemon {
    server: Option<Server>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<Appliance>>,
    jobs: JobSender,
    path: PathBuf,
}

fn sock_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dpd-test-{}-{tag}.sock", std::process::id()))
}

fn start(tag: &str) -> Daemon {
    let path = sock_path(tag);
    let (tx, rx) = job_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let worker = std::thread::spawn(move || {
        let cfg = EngineConfig {
            local_mac: MacAddr(MAC),
            local_ip: LocalIp { v4: Some(IP), v6: None },
            qpn_base: 0x100,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(cfg);
        let neigh = Neighbours::new(MacAddr(MAC), Some(IP), None);
        let mut a = Appliance::new();
        let t0 = Instant::now();
        let mut buf = vec![0u8; 9000];
        while !st.load(Ordering::Relaxed) {
            while let Ok(job) = rx.try_recv() {
                a.serve(&mut e, &neigh, job, &|_| {});
            }
            let now = roce_dp::Instant(t0.elapsed().as_nanos() as u64);
            let mut busy = a.poll(&mut e);
            // Loopback: every frame the engine sends comes straight back in.
            while let Some(n) = e.poll_transmit(now, &mut buf) {
                let frame = buf[..n].to_vec();
                e.handle_rx(now, &frame, roce_dp::RxMeta::default());
                busy = true;
            }
            if e.poll_timeout().is_some_and(|t| t <= now) {
                e.handle_timeout(now);
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        a
    });
    let info =
        DeviceInfo { abi: 1, pid: std::process::id(), mac: MAC, ipv4: Some(IP), ipv6: None, mtu: 1024, hugetlb: false };
    let cfg = ServerConfig {
        path: path.clone(),
        mode: 0o600,
        backing: Backing::Pages,
        info,
        max_depth: 4096,
        limits: Default::default(),
        log: false,
        stats_page_bytes: roce_dp::ctrl::proto::STATS_PAGE_BYTES,
    };
    let server = Server::start(cfg, tx.clone()).expect("server starts");
    Daemon { server: Some(server), stop, worker: Some(worker), jobs: tx, path }
}

impl Daemon {
    /// Stops like roce-dpd does on SIGTERM: QPs to error and flushed, sessions told, socket removed.
    fn shutdown(&mut self) -> Appliance {
        let (tx, rx) = mpsc::channel();
        let _ = self.jobs.send(Job { client: 0, cmd: roce_dp::ctrl::daemon::Cmd::Shutdown, reply: tx });
        let _ = rx.recv_timeout(Duration::from_secs(5));
        if let Some(s) = self.server.take() {
            s.shutdown("test over");
        }
        self.stop.store(true, Ordering::Relaxed);
        self.worker.take().expect("worker").join().expect("worker thread")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.worker.is_some() {
            self.shutdown();
        }
    }
}

struct Side {
    dev: Device,
    _pd: roce_dp::client::Pd,
    mr: Mr,
    cq: Cq,
    qp: Qp,
}

fn side(path: &Path) -> Side {
    side_inline(path, 0)
}

/// A session with one QP whose send WRs may carry `max_inline` bytes inline.
fn side_inline(path: &Path, max_inline: u32) -> Side {
    let dev = Device::open(path).expect("open");
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.reg_mr(64 * 1024, AccessFlags::ALL).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let init = QpInit { sq_depth: 32, rq_depth: 32, max_send_sge: 2, max_recv_sge: 2, max_inline };
    let qp = dev.create_qp(&pd, &cq, &cq, init).unwrap();
    Side { dev, _pd: pd, mr, cq, qp }
}

fn connect(a: &Side, b: &Side) {
    for (x, y, psn) in [(a, b, 100), (b, a, 200)] {
        x.qp.to_init(AccessFlags::ALL).unwrap();
        let r = Remote { qpn: y.qp.qpn(), psn: if psn == 100 { 200 } else { 100 }, gid: y.dev.gid(), mac: None };
        x.qp.to_rtr(&r, 1024).unwrap();
        x.qp.to_rts(psn).unwrap();
    }
}

fn wait(cq: &mut Cq) -> Cqe {
    let mut out = [Cqe::EMPTY; 1];
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if cq.poll(&mut out).unwrap() == 1 {
            return out[0];
        }
        assert!(Instant::now() < until, "no completion in 10 s");
        std::thread::yield_now();
    }
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn two_sessions_send_write_read_and_atomics_through_the_rings() {
    let mut d = start("ops");
    let (mut a, mut b) = (side(&d.path), side(&d.path));
    connect(&a, &b);
    assert_eq!(a.qp.query().unwrap().state, QpState::Rts);
    every_operation(&mut a, &mut b);

    let stats = a.dev.stats().unwrap();
    let get = |scope: &str, name: &str| stats.iter().find(|s| s.scope == scope && s.name == name).map(|s| s.value);
    assert_eq!(get("daemon", "qps"), Some(2));
    assert!(get("daemon", "wqes_posted").unwrap() >= 6);
    assert!(stats.iter().any(|s| s.scope == "qp" && s.id == a.qp.qpn() && s.name == "tx_packets" && s.value > 0));

    // Shutdown: the next poll or call reports the daemon gone, it does not hang.
    let app = d.shutdown();
    assert_eq!(app.counts(), (0, 0, 0, 0), "both sessions reclaimed");
    let e = poll_until_gone(&mut a.cq);
    assert!(e.to_string().contains("test over") && !e.to_string().contains('\n'), "{e}");
    let e = b.qp.query().unwrap_err();
    assert!(matches!(e, Error::DaemonGone { .. }), "{e}");
    assert!(!d.path.exists(), "socket removed");
}

/// Polls `cq` until the library reports the daemon gone (5 s at most); completions before that are returned too.
fn poll_until_gone(cq: &mut Cq) -> Error {
    poll_until_gone_with(cq).0
}

fn poll_until_gone_with(cq: &mut Cq) -> (Error, Vec<Cqe>) {
    let mut out = [Cqe::EMPTY; 4];
    let mut seen = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match cq.poll(&mut out) {
            Err(e) => {
                assert!(matches!(e, Error::DaemonGone { .. }), "{e}");
                return (e, seen);
            }
            Ok(n) => seen.extend_from_slice(&out[..n]),
        }
        assert!(Instant::now() < until, "poll never noticed the daemon going away");
    }
}

/// SEND, WRITE, READ, FETCH_ADD and CMP_SWP from A to B, every byte checked, then A trying B's lkey.
fn every_operation(a: &mut Side, b: &mut Side) {
    // SEND of 3000 bytes (3 packets at MTU 1024) from two SGEs into one receive buffer.
    let data = pattern(1, 3000);
    a.mr.as_mut_slice()[..3000].copy_from_slice(&data);
    b.qp.post_recv(7, &[b.mr.sge(8192, 4096)]).unwrap();
    a.qp.post_send(&SendWr::new(1, WrOpcode::Send), &[a.mr.sge(0, 1000), a.mr.sge(1000, 2000)]).unwrap();
    let c = wait(&mut a.cq);
    assert_eq!((c.wr_id, c.status, c.opcode), (1, WcStatus::Success, WcOpcode::Send));
    let r = wait(&mut b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (7, WcStatus::Success, 3000));
    assert_eq!(&b.mr.as_slice()[8192..8192 + 3000], &data[..]);

    // WRITE of 10000 bytes into B's buffer at an offset.
    let data = pattern(2, 10_000);
    a.mr.as_mut_slice()[..10_000].copy_from_slice(&data);
    let wr = SendWr::new(2, WrOpcode::RdmaWrite).remote(b.mr.addr() + 20_000, b.mr.rkey());
    a.qp.post_send(&wr, &[a.mr.sge(0, 10_000)]).unwrap();
    assert_eq!(wait(&mut a.cq).status, WcStatus::Success);
    assert_eq!(&b.mr.as_slice()[20_000..30_000], &data[..]);

    // READ back 5000 bytes of what B holds.
    let want = pattern(3, 5000);
    b.mr.as_mut_slice()[40_000..45_000].copy_from_slice(&want);
    let wr = SendWr::new(3, WrOpcode::RdmaRead).remote(b.mr.addr() + 40_000, b.mr.rkey());
    a.qp.post_send(&wr, &[a.mr.sge(50_000, 5000)]).unwrap();
    let c = wait(&mut a.cq);
    assert_eq!((c.status, c.opcode, c.byte_len), (WcStatus::Success, WcOpcode::RdmaRead, 5000));
    assert_eq!(&a.mr.as_slice()[50_000..55_000], &want[..]);

    // FETCH_ADD then CMP_SWP on a counter in B's buffer; the originals land in A's buffer.
    b.mr.as_mut_slice()[64..72].copy_from_slice(&1000u64.to_le_bytes());
    let mut wr = SendWr::new(4, WrOpcode::AtomicFetchAdd).remote(b.mr.addr() + 64, b.mr.rkey());
    wr.compare_add = 5;
    a.qp.post_send(&wr, &[a.mr.sge(256, 8)]).unwrap();
    assert_eq!(wait(&mut a.cq).status, WcStatus::Success);
    assert_eq!(u64::from_le_bytes(a.mr.as_slice()[256..264].try_into().unwrap()), 1000);
    let mut wr = SendWr::new(5, WrOpcode::AtomicCmpSwp).remote(b.mr.addr() + 64, b.mr.rkey());
    wr.compare_add = 1005;
    wr.swap = 77;
    a.qp.post_send(&wr, &[a.mr.sge(264, 8)]).unwrap();
    assert_eq!(wait(&mut a.cq).status, WcStatus::Success);
    assert_eq!(u64::from_le_bytes(a.mr.as_slice()[264..272].try_into().unwrap()), 1005);
    assert_eq!(u64::from_le_bytes(b.mr.as_slice()[64..72].try_into().unwrap()), 77);

    // Isolation: A's QP cannot use B's lkey locally (another PD): the WR fails with a local protection error and
    // B's bytes do not move.
    let before = b.mr.as_slice()[..4096].to_vec();
    let wr = SendWr::new(6, WrOpcode::RdmaWrite).remote(b.mr.addr(), b.mr.rkey());
    a.qp.post_send(&wr, &[b.mr.sge(0, 4096)]).unwrap();
    assert_eq!(wait(&mut a.cq).status, WcStatus::LocProtErr);
    assert_eq!(&b.mr.as_slice()[..4096], &before[..]);
}

fn stat(recs: &[StatRecord], scope: &str, id: u32, name: &str) -> Option<u64> {
    recs.iter().find(|r| r.scope == scope && r.id == id && r.name == name).map(|r| r.value)
}

fn two_worker_daemon(tag: &str) -> LoopbackDaemon {
    LoopbackDaemon::start(LoopbackConfig { workers: 2, ..LoopbackConfig::new(sock_path(tag)) }).expect("daemon starts")
}

const WORKER1: u32 = 0x100 + QPN_STRIDE;

/// Two workers, each with its own engine: sessions' QPs land on the least-loaded worker, a QP follows its CQs,
/// PDs and keys are the same on both (traffic between QPs of different workers, every byte checked), a dead
/// session on worker 1 is reclaimed on both, and shutdown flushes the QPs of both.
#[test]
fn two_workers_own_their_qps_share_keys_reclaim_and_flush() {
    let mut d = two_worker_daemon("workers");
    // A session with several MRs ends without deregistering them: each worker frees their key slots in its own
    // order, so keys handed out later would differ between the workers if each picked its own.
    let z = Device::open(d.path()).unwrap();
    let zpd = z.alloc_pd().unwrap();
    let zmrs: Vec<Mr> = (0..6).map(|_| zpd.reg_mr(4096, AccessFlags::ALL).unwrap()).collect();
    z.abandon();
    let until = Instant::now() + Duration::from_secs(1);
    let probe = Device::open(d.path()).unwrap();
    while stat(&probe.stats().unwrap(), "daemon", 0, "mrs") != Some(0) {
        assert!(Instant::now() < until, "the abandoned session's MRs are still there");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop((zmrs, zpd, z, probe));
    let (mut a, mut b) = (side(d.path()), side(d.path()));
    assert!((0x100..WORKER1).contains(&a.qp.qpn()), "first QP on worker 0: {:#x}", a.qp.qpn());
    assert!(b.qp.qpn() >= WORKER1, "second QP on the least-loaded worker 1: {:#x}", b.qp.qpn());
    let st = a.dev.stats().unwrap();
    assert_eq!(stat(&st, "daemon", 0, "workers"), Some(2));
    assert_eq!(stat(&st, "qp", a.qp.qpn(), "worker"), Some(0));
    assert_eq!(stat(&st, "qp", b.qp.qpn(), "worker"), Some(1));
    assert_eq!((stat(&st, "worker", 0, "qps"), stat(&st, "worker", 1, "qps")), (Some(1), Some(1)));
    assert_eq!(stat(&st, "daemon", 0, "qps"), Some(2));
    assert_eq!(stat(&st, "daemon", 0, "mrs"), Some(2), "each MR counted once, though both workers hold it");
    assert_eq!(stat(&st, "daemon", 0, "pds"), Some(2));
    assert!(st.iter().any(|r| r.scope == "engine" && r.id == 1), "worker 1's engine reports");
    connect(&a, &b);
    every_operation(&mut a, &mut b);
    let st = a.dev.stats().unwrap();
    assert!(stat(&st, "worker", 0, "wqes_posted").unwrap_or(0) >= 6, "A's WRs went through worker 0");
    assert!(stat(&st, "worker", 1, "recvs_posted").unwrap_or(0) >= 1, "B's receive went through worker 1");
    for w in [0, 1] {
        assert!(stat(&st, "engine", w, "rx_frames").unwrap_or(0) > 0, "worker {w}'s engine received");
    }

    // A QP goes where its CQs are; CQs on two workers cannot serve one QP.
    let c = Device::open(d.path()).unwrap();
    let pd = c.alloc_pd().unwrap();
    let (cq1, cq2) = (c.create_cq(16).unwrap(), c.create_cq(16).unwrap());
    let q1 = c.create_qp(&pd, &cq1, &cq1, QpInit::default()).unwrap(); // loads 1, 1: worker 0
    let q2 = c.create_qp(&pd, &cq2, &cq2, QpInit::default()).unwrap(); // loads 2, 1: worker 1
    assert!(q1.qpn() < WORKER1 && q2.qpn() >= WORKER1, "{:#x} {:#x}", q1.qpn(), q2.qpn());
    let q3 = c.create_qp(&pd, &cq2, &cq2, QpInit::default()).unwrap(); // loads 2, 2, but cq2 is on worker 1
    assert!(q3.qpn() >= WORKER1, "a QP follows its bound CQ: {:#x}", q3.qpn());
    let e = c.create_qp(&pd, &cq1, &cq2, QpInit::default()).err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, Error::Refused { code: ErrorCode::Invalid, .. }), "{msg}");
    assert!(msg.contains("worker 0") && msg.contains("worker 1") && !msg.contains('\n'), "{msg}");
    assert!(c.create_qp(&pd, &cq1, &a.cq, QpInit::default()).is_err(), "another session's CQ");

    // B (worker 1) dies: its QP, CQ, MR and PD go from both workers within a second; A and C carry on.
    let mrs = || stat(&a.dev.stats().unwrap(), "daemon", 0, "mrs");
    assert_eq!(mrs(), Some(2));
    let b_qpn = b.qp.qpn();
    b.dev.abandon();
    let until = Instant::now() + Duration::from_secs(1);
    loop {
        let st = a.dev.stats().unwrap();
        if stat(&st, "qp", b_qpn, "client").is_none() && stat(&st, "daemon", 0, "mrs") == Some(1) {
            assert_eq!(stat(&st, "worker", 1, "qps"), Some(2), "C's two QPs are left on worker 1");
            assert_eq!(stat(&st, "daemon", 0, "pds"), Some(2));
            break;
        }
        assert!(Instant::now() < until, "worker 1's dead session is still there after 1 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(b);

    // Shutdown with QPs on both workers: a receive outstanding on each is flushed, then the daemon is gone.
    for (x, y) in [(&q2, &q3), (&q3, &q2)] {
        x.to_init(AccessFlags::ALL).unwrap();
        x.to_rtr(&Remote { qpn: y.qpn(), psn: 0, gid: c.gid(), mac: None }, 1024).unwrap();
        x.to_rts(0).unwrap();
    }
    let mut q2 = q2;
    let mut cq2 = cq2;
    a.qp.post_recv(11, &[a.mr.sge(0, 64)]).unwrap();
    q2.post_recv(22, &[]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let apps = d.shutdown_workers("test over").expect("both workers stopped cleanly");
    assert_eq!(apps.len(), 2);
    for (w, app) in apps.iter().enumerate() {
        assert_eq!(app.counts(), (0, 0, 0, 0), "worker {w}: every session reclaimed");
    }
    for (cq, wr_id) in [(&mut a.cq, 11), (&mut cq2, 22)] {
        let (e, seen) = poll_until_gone_with(cq);
        assert!(seen.iter().any(|c| c.wr_id == wr_id && c.status == WcStatus::WrFlushErr), "{wr_id}: {seen:?}");
        assert!(e.to_string().contains("test over"), "{e}");
    }
}

/// Inline data through the rings: copied at post time (the buffer is reused at once and is not in any registered
/// region), SEND and WRITE between QPs of two workers; limits refused with one line at the client and the daemon.
#[test]
fn inline_payload_is_copied_at_post_time() {
    let d = two_worker_daemon("inline");
    let (mut a, mut b) = (side_inline(d.path(), 200), side_inline(d.path(), 0));
    assert_eq!(a.qp.max_inline(), 256, "200 rounded up to a multiple of 64");
    assert_eq!(b.qp.max_inline(), 0);
    assert!(b.qp.qpn() >= WORKER1, "B on worker 1");
    connect(&a, &b);
    b.mr.as_mut_slice().fill(0);

    let mut buf = pattern(5, 256);
    let sent = buf.clone();
    b.qp.post_recv(1, &[b.mr.sge(0, 4096)]).unwrap();
    a.qp.post_send_inline(&SendWr::new(10, WrOpcode::Send), &buf[..200]).unwrap();
    buf.fill(0xee); // reused at once: the SEND carries what was there at post time
    let wr = SendWr::new(11, WrOpcode::RdmaWrite).remote(b.mr.addr() + 8192, b.mr.rkey());
    a.qp.post_send_inline(&wr, &buf).unwrap();
    buf.fill(0x11);
    let mut imm = SendWr::new(12, WrOpcode::RdmaWriteWithImm).remote(b.mr.addr() + 16384, b.mr.rkey());
    imm.imm = 0x1234;
    b.qp.post_recv(2, &[]).unwrap();
    a.qp.post_send_inline(&imm, &buf[..1]).unwrap();
    for want in [10, 11, 12] {
        let c = wait(&mut a.cq);
        assert_eq!((c.wr_id, c.status), (want, WcStatus::Success));
    }
    let r = wait(&mut b.cq);
    assert_eq!((r.wr_id, r.status, r.byte_len), (1, WcStatus::Success, 200));
    let r = wait(&mut b.cq);
    assert_eq!((r.wr_id, r.status, r.imm), (2, WcStatus::Success, Some(0x1234)));
    assert_eq!(&b.mr.as_slice()[..200], &sent[..200]);
    assert!(b.mr.as_slice()[200..8192].iter().all(|&x| x == 0), "nothing past the SEND's 200 bytes");
    assert!(b.mr.as_slice()[8192..8192 + 256].iter().all(|&x| x == 0xee));
    assert_eq!(b.mr.as_slice()[16384], 0x11);

    // Limits: more than the QP's max_inline, inline on a READ, inline on a QP without it; max_inline over the
    // daemon's limit.
    let read = SendWr::new(21, WrOpcode::RdmaRead).remote(b.mr.addr(), b.mr.rkey());
    for (on_a, wr, n) in
        [(true, SendWr::new(20, WrOpcode::Send), 257), (true, read, 8), (false, SendWr::new(22, WrOpcode::Send), 1)]
    {
        let qp = if on_a { &mut a.qp } else { &mut b.qp };
        let e = qp.post_send_inline(&wr, &vec![0; n]).unwrap_err();
        assert!(matches!(e, Error::BadRequest(_)) && !e.to_string().contains('\n'), "{e}");
    }
    let init = QpInit { max_inline: roce_dp::ctrl::abi::MAX_INLINE_DATA + 1, ..QpInit::default() };
    let e = a.dev.create_qp(&a._pd, &a.cq, &a.cq, init).err().unwrap();
    assert!(matches!(e, Error::Refused { code: ErrorCode::Invalid, .. }), "{e}");
    assert!(e.to_string().contains("max_inline 1025 exceeds the daemon's limit of 1024 bytes"), "{e}");
    let init = QpInit { max_inline: roce_dp::ctrl::abi::MAX_INLINE_DATA, ..QpInit::default() };
    assert_eq!(a.dev.create_qp(&a._pd, &a.cq, &a.cq, init).unwrap().max_inline(), 1024);
    // Both QPs still work.
    assert_eq!(a.qp.query().unwrap().state, QpState::Rts);
    assert_eq!(b.qp.query().unwrap().state, QpState::Rts);
}

#[test]
fn handles_of_another_session_are_not_found_and_death_reclaims() {
    let d = start("iso");
    let a = side(&d.path);
    let dev = Device::open(&d.path).unwrap();
    let pd = dev.alloc_pd().unwrap();
    // A's PD and CQ handles mean nothing in this session.
    let cq = dev.create_cq(8).unwrap();
    let e = dev.create_qp(&a._pd, &cq, &cq, QpInit::default()).err().unwrap();
    assert!(matches!(e, Error::Refused { code: ErrorCode::NotFound, .. }), "{e}");
    let e = dev.create_qp(&pd, &a.cq, &a.cq, QpInit::default()).err().unwrap();
    assert!(matches!(e, Error::Refused { code: ErrorCode::NotFound, .. }), "{e}");
    let stats = || dev.stats().unwrap().iter().find(|s| s.scope == "daemon" && s.name == "qps").unwrap().value;
    assert_eq!(stats(), 1);
    // A's session ends without destroying anything (as a killed process would): its objects go at once.
    a.dev.abandon();
    let until = Instant::now() + Duration::from_secs(1);
    while stats() != 0 {
        assert!(Instant::now() < until, "the dead session's QP is still there after 1 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn open_errors_are_one_actionable_line() {
    let path = sock_path("absent");
    let e = Device::open(&path).unwrap_err();
    assert!(matches!(e, Error::DaemonAbsent { .. }));
    let msg = e.to_string();
    assert!(msg.starts_with("no roce-dpd listening on ") && msg.contains("roce-dpd --config") && !msg.contains('\n'));

    let d = start("abi");
    let e = Device::open_as(&d.path, 99).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::AbiMismatch(_)), "{msg}");
    assert!(
        msg.contains(&format!("v{}", roce_dp::ctrl::abi::ABI_VERSION)) && msg.contains("v99") && !msg.contains('\n'),
        "{msg}"
    );
    // A second daemon on the same path is refused with one line; a stale socket file is replaced.
    let (tx, _rx) = job_channel();
    let info = DeviceInfo { abi: 1, pid: 0, mac: MAC, ipv4: Some(IP), ipv6: None, mtu: 1024, hugetlb: false };
    let cfg = ServerConfig {
        path: d.path.clone(),
        mode: 0o600,
        backing: Backing::Pages,
        info,
        max_depth: 64,
        limits: Default::default(),
        log: false,
        stats_page_bytes: roce_dp::ctrl::proto::STATS_PAGE_BYTES,
    };
    let e = Server::start(cfg.clone(), tx.clone()).err().unwrap();
    assert!(e.0.contains("in use by a running daemon"), "{e}");
    let stale = sock_path("stale");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let s = Server::start(ServerConfig { path: stale.clone(), ..cfg }, tx).expect("stale socket replaced");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&stale).unwrap().permissions().mode() & 0o777, 0o600);
    s.shutdown("done");
    assert!(!stale.exists());
}

/// A session that speaks the protocol itself and scribbles on its own QP's rings (the daemon's view of a hostile
/// process): every bad WQE errors that QP with LOC_QP_OP_ERR and a vendor code, foreign keys fail the engine's PD
/// checks, a corrupt index stops the ring; the well-behaved pair in the same daemon is untouched and keeps working.
#[test]
fn garbage_in_one_sessions_rings_errors_only_its_own_qps() {
    use roce_dp::ctrl::abi::{self, wr_opcode, RegionHeader, Wqe};
    use roce_dp::ctrl::proto::{Conn, ModifyQp, Request, Response};
    use roce_dp::ctrl::shm::{ClientCqRegion, ShmRegion};
    use std::os::unix::net::UnixStream;

    let d = start("garbage");
    let (mut a, mut b) = (side(&d.path), side(&d.path));
    connect(&a, &b);
    b.mr.as_mut_slice().fill(0x5a);

    let mut conn = Conn::new(UnixStream::connect(&d.path).unwrap());
    let mut seq = 0;
    let mut call = |conn: &mut Conn, q: Request| {
        seq += 1;
        conn.send_request(seq, &q, &[]).unwrap();
        let f = conn.recv_response().unwrap();
        (f.msg, f.fds)
    };
    assert!(matches!(call(&mut conn, Request::Hello { abi: abi::ABI_VERSION }).0, Response::Hello(_)));
    let Response::Pd { pd } = call(&mut conn, Request::AllocPd).0 else { panic!("pd") };
    let (Response::Cq { cq }, mut fds) = call(&mut conn, Request::CreateCq { depth: 64, channel: None }) else {
        panic!("cq")
    };
    // SAFETY: the only client side of this CQ in the process.
    let mut hcq = unsafe { ClientCqRegion::open(fds.pop().unwrap()) }.unwrap();
    let mut qp = |conn: &mut Conn| {
        let q = Request::CreateQp {
            pd,
            send_cq: cq,
            recv_cq: cq,
            sq_depth: 16,
            rq_depth: 16,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline: 0,
        };
        let (Response::Qp { qpn }, mut fds) = call(conn, q) else { panic!("qp") };
        let region = ShmRegion::map(fds.pop().unwrap()).unwrap();
        let h: RegionHeader = region.read(0).unwrap();
        (qpn, region, h)
    };
    let (q1, mut r1, h1) = qp(&mut conn);
    let (q2, mut r2, h2) = qp(&mut conn);
    let (q3, mut r3, h3) = qp(&mut conn);
    // Q2 and Q3 connect to themselves (loopback), so their WRs really run.
    for q in [q2, q3] {
        for attr in common::raw_connect_attrs(q) {
            let gid = Some(std::net::Ipv4Addr::from(IP).to_ipv6_mapped().octets());
            let m = ModifyQp { attr, gid: if attr.state == Some(QpState::Rtr) { gid } else { None }, mac: None };
            assert_eq!(call(&mut conn, Request::ModifyQp { qpn: q, m }).0, Response::Ok);
        }
    }
    // Hand-written WQEs: slot `i` of the send ring, then the producer index.
    let put = |r: &mut ShmRegion, h: &RegionHeader, i: u32, w: Wqe, tail: u32| {
        let base = h.sq.offset as usize;
        r.write(base + 256 + (i as usize % h.sq.capacity as usize) * 64, w).unwrap();
        r.write(base + 128, tail).unwrap();
    };
    // Q1: an unknown opcode.
    put(&mut r1, &h1, 0, Wqe { wr_id: 0xbad1, opcode: 77, num_sge: 1, ..Wqe::default() }, 1);
    // Q2: a WRITE whose local SGE is the other session's region (A's lkey), aimed at B's buffer with B's rkey.
    let foreign = abi::Sge { addr: a.mr.addr(), len: 64, lkey: a.mr.lkey() };
    let w = Wqe {
        wr_id: 0xbad2,
        opcode: wr_opcode::RDMA_WRITE,
        flags: abi::send_flags::SIGNALED,
        num_sge: 1,
        remote_addr: b.mr.addr(),
        rkey: b.mr.rkey(),
        sge0: foreign,
        ..Wqe::default()
    };
    put(&mut r2, &h2, 0, w, 1);
    // Q3: a producer index far ahead of anything written (a corrupt ring).
    put(&mut r3, &h3, 0, Wqe::default(), 1000);

    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    let mut out = [Cqe::EMPTY; 8];
    while got.len() < 3 && Instant::now() < until {
        let n = hcq.cq.poll(&mut out).unwrap();
        got.extend_from_slice(&out[..n]);
        std::thread::yield_now();
    }
    let find =
        |qpn: u32| got.iter().find(|c| c.qpn == qpn).copied().unwrap_or_else(|| panic!("no CQE of {qpn:#x}: {got:?}"));
    let c1 = find(q1);
    assert_eq!((c1.wr_id, c1.status), (0xbad1, WcStatus::LocQpOpErr));
    let c2 = find(q2);
    assert_eq!((c2.wr_id, c2.status), (0xbad2, WcStatus::LocProtErr), "A's lkey is not in this session's PD");
    let c3 = find(q3);
    assert_eq!(c3.status, WcStatus::LocQpOpErr, "corrupt ring");
    for q in [q1, q3] {
        let Response::QpInfo(i) = call(&mut conn, Request::QueryQp { qpn: q }).0 else { panic!("query") };
        assert_eq!(i.state, QpState::Err, "{q:#x}");
    }
    // B's memory untouched; A and B still work.
    assert!(b.mr.as_slice().iter().all(|&x| x == 0x5a));
    let data = pattern(9, 2000);
    a.mr.as_mut_slice()[..2000].copy_from_slice(&data);
    let wr = SendWr::new(9, WrOpcode::RdmaWrite).remote(b.mr.addr() + 100, b.mr.rkey());
    a.qp.post_send(&wr, &[a.mr.sge(0, 2000)]).unwrap();
    assert_eq!(wait(&mut a.cq).status, WcStatus::Success);
    assert_eq!(&b.mr.as_slice()[100..2100], &data[..]);
    assert_eq!(a.qp.query().unwrap().state, QpState::Rts);
}
