//! The appliance without DPDK: a `Server` on a Unix socket and an `Appliance` on one engine whose frames loop back
//! into itself (both QPs on one soft NIC, as `roce-dpd` on a loopback port), driven by a worker thread; two client
//! sessions through the client library do SEND, WRITE, READ and both atomics with every byte checked, and the
//! isolation, error and shutdown paths are checked.

#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use roce_dp::client::{Cq, Device, Error, ErrorCode, Mr, Qp, QpInit, Remote};
use roce_dp::ctrl::daemon::{Appliance, Job, Server, ServerConfig};
use roce_dp::ctrl::proto::DeviceInfo;
use roce_dp::ctrl::shm::Backing;
use roce_dp::neigh::Neighbours;
use roce_dp::wire::MacAddr;
use roce_dp::{AccessFlags, Cqe, Engine, EngineConfig, LocalIp, QpState, SendWr, WcOpcode, WcStatus, WrOpcode};

const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const IP: [u8; 4] = [10, 0, 0, 1];

struct Daemon {
    server: Option<Server>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<Appliance>>,
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
}

fn sock_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dpd-test-{}-{tag}.sock", std::process::id()))
}

fn start(tag: &str) -> Daemon {
    let path = sock_path(tag);
    let (tx, rx) = mpsc::channel::<Job>();
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
    let cfg =
        ServerConfig { path: path.clone(), mode: 0o600, backing: Backing::Pages, info, max_depth: 4096, log: false };
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
    let dev = Device::open(path).expect("open");
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.reg_mr(64 * 1024, AccessFlags::ALL).unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp =
        dev.create_qp(&pd, &cq, &cq, QpInit { sq_depth: 32, rq_depth: 32, max_send_sge: 2, max_recv_sge: 2 }).unwrap();
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

    let stats = a.dev.stats().unwrap();
    let get = |scope: &str, name: &str| stats.iter().find(|s| s.scope == scope && s.name == name).map(|s| s.value);
    assert_eq!(get("daemon", "qps"), Some(2));
    assert!(get("daemon", "wqes_posted").unwrap() >= 6);
    assert!(stats.iter().any(|s| s.scope == "qp" && s.id == a.qp.qpn() && s.name == "tx_packets" && s.value > 0));

    // Shutdown: the next poll or call reports the daemon gone, it does not hang.
    let app = d.shutdown();
    assert_eq!(app.counts(), (0, 0, 0, 0), "both sessions reclaimed");
    let mut out = [Cqe::EMPTY; 4];
    let until = Instant::now() + Duration::from_secs(5);
    let e = loop {
        match a.cq.poll(&mut out) {
            Err(e) => break e,
            Ok(_) => assert!(Instant::now() < until, "poll never noticed the daemon going away"),
        }
    };
    assert!(matches!(e, Error::DaemonGone { .. }), "{e}");
    assert!(e.to_string().contains("test over") && !e.to_string().contains('\n'), "{e}");
    let e = b.qp.query().unwrap_err();
    assert!(matches!(e, Error::DaemonGone { .. }), "{e}");
    assert!(!d.path.exists(), "socket removed");
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
    assert!(msg.contains("v1") && msg.contains("v99") && !msg.contains('\n'), "{msg}");
    // A second daemon on the same path is refused with one line; a stale socket file is replaced.
    let (tx, _rx) = mpsc::channel();
    let info = DeviceInfo { abi: 1, pid: 0, mac: MAC, ipv4: Some(IP), ipv6: None, mtu: 1024, hugetlb: false };
    let cfg =
        ServerConfig { path: d.path.clone(), mode: 0o600, backing: Backing::Pages, info, max_depth: 64, log: false };
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
    use roce_dp::QpAttr;
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
    let (Response::Cq { cq }, mut fds) = call(&mut conn, Request::CreateCq { depth: 64 }) else { panic!("cq") };
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
        for attr in [
            QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() },
            QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(1024),
                dest_qpn: Some(q),
                rq_psn: Some(0),
                max_dest_rd_atomic: Some(4),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(0),
                timeout: Some(10),
                retry_cnt: Some(1),
                max_rd_atomic: Some(4),
                ..QpAttr::default()
            },
        ] {
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
